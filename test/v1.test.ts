import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

function v1(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: object, as = token) {
  return ctx.app.inject({ method, url: `/api/v1${url}`, headers: bearer(as), ...(payload ? { payload } : {}) });
}

describe('v1 envelope', () => {
  it('wraps 401 missing_api_key', async () => {
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v1/emails', payload: { content: 'x' } });
    expect(res.statusCode).toBe(401);
    expect(res.json()).toEqual({ success: false, error: { name: 'missing_api_key', message: expect.any(String), statusCode: 401 } });
  });

  it('wraps an unknown v1 path as 404 and leaves v2-only paths out', async () => {
    for (const url of ['/nope', '/domains', '/tokens', '/tools']) {
      const res = await v1('GET', url);
      expect(res.statusCode).toBe(404);
      expect(res.json()).toMatchObject({ success: false, error: { name: 'not_found', statusCode: 404 } });
    }
  });

  it('wraps its own validation of a send as 422 with details', async () => {
    const res = await v1('POST', '/emails', { from: 'a@b.example', to: 'c@d.example', subject: 'Hi', contentType: 'PDF' });
    expect(res.statusCode).toBe(422);
    const body = res.json();
    expect(body.success).toBe(false);
    expect(body.error).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(body.error.details.map((d: { path: string }) => d.path).sort()).toEqual(['content', 'contentType']);
  });

  it('wraps invalid JSON as 400 invalid_json', async () => {
    const res = await ctx.app.inject({
      method: 'POST',
      url: '/api/v1/emails',
      headers: { ...bearer(token), 'content-type': 'application/json' },
      payload: '{nope',
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ success: false, error: { name: 'invalid_json' } });
  });

  it('refuses a bad page or limit with a wrapped 422', async () => {
    for (const query of ['page=0', 'limit=101', 'page=x']) {
      const res = await v1('GET', `/subscribers?${query}`);
      expect(res.statusCode).toBe(422);
      expect(res.json()).toMatchObject({ success: false, error: { name: 'validation_error' } });
    }
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from './helpers/context.js';

let ctx: TestContext;

beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

describe('operator endpoints (docs/operations.md "Health endpoints")', () => {
  it('GET /healthz answers without a token', async () => {
    const res = await ctx.app.inject({ url: '/healthz' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ status: 'ok' });
  });

  it('GET /readyz checks PostgreSQL and Redis', async () => {
    const res = await ctx.app.inject({ url: '/readyz' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ status: 'ready', checks: { postgres: 'up', redis: 'up' } });
  });

  it('GET /api/v2/openapi.json is OpenAPI 3.1 generated from the route schemas', async () => {
    const res = await ctx.app.inject({ url: '/api/v2/openapi.json' });
    expect(res.statusCode).toBe(200);
    const doc = res.json();
    expect(doc.openapi).toBe('3.1.0');
    expect(doc.components.securitySchemes.bearer).toMatchObject({ type: 'http', scheme: 'bearer' });
    const create = doc.paths['/api/v2/tokens'].post;
    expect(create.requestBody.content['application/json'].schema.properties).toHaveProperty('preset');
    expect(create.requestBody.content['application/json'].schema.required).toEqual(['name']);
    expect(doc.paths['/api/v2/tokens'].get.parameters.map((p: { name: string }) => p.name)).toContain('limit');
    // Operator routes are not part of the API document.
    expect(doc.paths['/healthz']).toBeUndefined();
  });

  it('GET /docs serves the viewer', async () => {
    const res = await ctx.app.inject({ url: '/docs' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/text\/html/);
  });
});

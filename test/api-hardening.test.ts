import { request as httpRequest } from 'node:http';
import type { FastifyRequest } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dispatch } from '../src/api/tools/dispatch.js';
import { runOverHttp } from './helpers/agents.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

// Inputs no client should be able to turn into a 500, another endpoint or another identity.
let ctx: TestContext;
let acme: { organizationId: string; token: string };
let globex: { organizationId: string; token: string };
let baseUrl: string;

beforeAll(async () => {
  ctx = await createTestContext();
  acme = await createOrg(ctx.services, { name: 'Acme' });
  globex = await createOrg(ctx.services, { name: 'Globex' });
  baseUrl = await ctx.app.listen({ host: '127.0.0.1', port: 0 });
});
afterAll(async () => ctx?.close());

const ERROR_KEYS = ['message', 'name', 'statusCode'];

function expectErrorShape(body: Record<string, unknown>, status: number, name: string) {
  expect(Object.keys(body).filter((k) => k !== 'details').sort()).toEqual(ERROR_KEYS);
  expect(body).toMatchObject({ statusCode: status, name });
}

/** A raw HTTP request: the path goes on the wire exactly as given (fetch would resolve `..`). */
function raw(method: string, path: string, headers: Record<string, string>, body?: unknown): Promise<{ status: number; body: any; headers: Record<string, unknown> }> {
  const { port } = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = httpRequest(
      { host: '127.0.0.1', port, method, path, headers: { ...headers, ...(payload ? { 'content-type': 'application/json' } : {}) } },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk) => (text += chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : null, headers: res.headers }));
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

async function tokenNames(token: string): Promise<string[]> {
  const res = await ctx.app.inject({ url: '/api/v2/tokens?limit=100', headers: bearer(token) });
  return res.json().data.map((t: { id: string }) => t.id);
}

describe('dispatched requests (tools, MCP, v1) run as the caller only', () => {
  const from = (token?: string) => ({ id: 'req-1', headers: token ? bearer(token) : {} }) as unknown as FastifyRequest;

  it('keeps the caller\'s Authorization whatever headers the target asks for', async () => {
    const acmeTokens = await tokenNames(acme.token);
    const target = {
      method: 'GET' as const,
      url: '/api/v2/tokens',
      query: { limit: 100 },
      headers: { authorization: `Bearer ${globex.token}`, Authorization: `Bearer ${globex.token}`, 'x-request-id': 'forged' } as never,
    };
    const answer = await dispatch(ctx.app, from(acme.token), target);
    expect(answer.statusCode).toBe(200);
    expect((answer.body as { data: Array<{ id: string }> }).data.map((t) => t.id)).toEqual(acmeTokens);

    // A caller without a token does not borrow one from the target either.
    const anonymous = await dispatch(ctx.app, from(), target);
    expect(anonymous.statusCode).toBe(401);
  });

  it('passes the Idempotency-Key on, and nothing else', async () => {
    const send = {
      from: 'a@acme.test',
      to: 'b@example.com',
      subject: 'Hi',
      markdown: 'hello',
    };
    const first = await dispatch(ctx.app, from(acme.token), { method: 'POST', url: '/api/v2/emails', body: send, headers: { 'idempotency-key': 'k-1' } });
    const again = await dispatch(ctx.app, from(acme.token), { method: 'POST', url: '/api/v2/emails', body: send, headers: { 'idempotency-key': 'k-1' } });
    expect(first.statusCode).toBe(200);
    expect(again.body).toEqual(first.body);
  });

  it('refuses tool arguments that are not in the tool schema (no header smuggling)', async () => {
    const answer = await runOverHttp(ctx, acme.token, 'send_email', {
      from: 'a@acme.test',
      to: 'b@example.com',
      subject: 'Hi',
      markdown: 'hello',
      authorization: `Bearer ${globex.token}`,
    });
    expect(answer.statusCode).toBe(422);
  });

  it('answers 404 to a "." or ".." path segment instead of running another endpoint', async () => {
    // Over the wire `..` reaches the v1 route as a parameter; `app.inject` would resolve it
    // and run POST /api/v2/tags (create a tag) for a subscriber's add-tags call.
    for (const segment of ['..', '%2E%2E', '.%2e', '.']) {
      const res = await raw('POST', `/api/v1/subscribers/${segment}/tags`, bearer(acme.token), { tags: ['x'], name: `smuggled${segment}` });
      expect(res.status).toBe(404);
      expect(res.body).toMatchObject({ success: false, error: { name: 'not_found', statusCode: 404 } });
    }
    const tags = (await ctx.app.inject({ url: '/api/v2/tags', headers: bearer(acme.token) })).json().data;
    expect(tags.map((t: { name: string }) => t.name).filter((n: string) => n.startsWith('smuggled'))).toEqual([]);

    for (const subscriber of ['..', '.', '%2e%2e']) {
      const answer = await runOverHttp(ctx, acme.token, 'unsubscribe_subscriber', { subscriber });
      expect(answer).toMatchObject({ statusCode: 404, body: { name: 'not_found' } });
    }
  });
});

import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { BODY_LIMIT, buildApp } from '../src/api/app.js';
import type { App } from '../src/api/types.js';
import { loadConfig } from '../src/shared/config.js';
import { closeServices, createServices, type Services } from '../src/shared/container.js';
import { createLogger } from '../src/shared/logger.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { closedPort } from './helpers/process.js';
import { TcpProxy } from './helpers/proxy.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

const ERROR_KEYS = ['message', 'name', 'statusCode'];

function postTokens(payload: string | Buffer, contentType?: string) {
  return ctx.app.inject({
    method: 'POST',
    url: '/api/v2/tokens',
    headers: { ...bearer(token), ...(contentType ? { 'content-type': contentType } : {}) },
    payload,
  });
}

describe('malformed requests (docs/foundation.md "Errors")', () => {
  it.each([
    ['a truncated object', '{"name": '],
    ['a bare word', 'hello'],
    ['a trailing comma', '{"name": "x",}'],
  ])('answers 400 invalid_json to %s', async (_label, body) => {
    const res = await postTokens(body, 'application/json');
    expect(res.statusCode).toBe(400);
    expect(res.json()).toEqual({ name: 'invalid_json', message: expect.any(String), statusCode: 400 });
  });

  it('answers 400 invalid_json to bytes that are not UTF-8 (RFC 8259 8.1), whatever charset is declared, and creates nothing', async () => {
    const latin1 = Buffer.concat([Buffer.from('{"name":"Jos'), Buffer.from([0xe9]), Buffer.from('"}')]);
    for (const contentType of ['application/json', 'application/json; charset=iso-8859-1']) {
      const res = await postTokens(latin1, contentType);
      expect(res.statusCode, contentType).toBe(400);
      expect(res.json()).toEqual({ name: 'invalid_json', message: 'The body is not valid JSON: it is not UTF-8', statusCode: 400 });
    }
    const tokens = await ctx.app.inject({ method: 'GET', url: '/api/v2/tokens', headers: bearer(token) });
    expect(tokens.json().data.map((t: { name: string }) => t.name)).not.toContain('Jos\ufffd');
    // The same name in UTF-8 is taken as sent.
    const utf8 = await postTokens(Buffer.from('{"name":"José"}'), 'application/json');
    expect(utf8.statusCode).toBe(200);
    expect(utf8.json().name).toBe('José');
  });

  it.each([
    ['a "__proto__" key', '{"name":"x","__proto__":{"admin":true}}'],
    ['a "constructor" holding "prototype"', '{"name":"x","constructor":{"prototype":{"admin":true}}}'],
  ])('answers valid JSON with %s (prototype poisoning) 422 validation_error, and creates nothing', async (_label, body) => {
    const res = await postTokens(body, 'application/json');
    expect(res.statusCode).toBe(422);
    expect(res.json()).toEqual({ name: 'validation_error', message: expect.stringContaining('__proto__'), statusCode: 422, details: [{ path: 'body', message: expect.any(String) }] });
  });

  it('refuses a body nested deeper than 512 levels as a validation error in the status of the route (it overflowed the stack: 500)', async () => {
    const nested = (depth: number) => `${'{"n":'.repeat(depth)}1${'}'.repeat(depth)}`;
    // POST /events answers its validation errors 400 (docs/audience.md "Events"); a deep `data` was a 500.
    const event = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/events',
      headers: { ...bearer(token), 'content-type': 'application/json' },
      payload: `{"eventType":"SUBSCRIBER_PAYMENT","subscriber":"deep@example.com","data":${nested(5_000)}}`,
    });
    expect(event.statusCode).toBe(400);
    expect(event.json()).toMatchObject({ name: 'validation_error', message: 'body: is nested deeper than 512 levels' });
    // 422 elsewhere; brackets inside strings are not levels, and 511 levels are parsed (the
    // route then names the unknown field).
    const campaign = await ctx.app.inject({ method: 'POST', url: '/api/v2/campaigns', headers: { ...bearer(token), 'content-type': 'application/json' }, payload: `{"name":"deep","contentType":"MAILY","content":${nested(600)}}` });
    expect(campaign.statusCode).toBe(422);
    expect(campaign.json().message).toBe('body: is nested deeper than 512 levels');
    const strings = await postTokens(JSON.stringify({ name: '{['.repeat(600) }), 'application/json');
    expect(strings.json().message).not.toContain('nested');
    const fits = await postTokens(`{"name":"x","extra":${nested(510)}}`, 'application/json');
    expect(fits.json()).toMatchObject({ statusCode: 422, details: [{ path: 'extra' }] });
    // JSON given as text inside a body (a tiptap document) is held to the same depth.
    const quotes = (depth: number): object => (depth === 0 ? { type: 'paragraph' } : { type: 'blockquote', content: [quotes(depth - 1)] });
    const tiptap = JSON.stringify({ type: 'doc', content: [quotes(600)] });
    const email = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: bearer(token), payload: { from: 'a@example.test', to: 'b@example.net', subject: 's', tiptap } });
    expect(email.statusCode).toBe(422);
    expect(email.json().details).toEqual([{ path: 'tiptap', message: 'is nested deeper than 512 levels' }]);
  });

  it('takes an empty body declared as JSON as no body: the route answers what it answers without one', async () => {
    // POST /tokens needs a body: its validation error, not a parse error.
    const res = await postTokens('', 'application/json');
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error' });
  });

  it.each(['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/xml'])(
    'answers 415 unsupported_media_type to %s',
    async (contentType) => {
      const res = await postTokens('name=x', contentType);
      expect(res.statusCode).toBe(415);
      expect(res.json()).toEqual({ name: 'unsupported_media_type', message: expect.any(String), statusCode: 415 });
    },
  );

  it('answers 415 to a compressed body (Content-Encoding), and takes `identity`', async () => {
    const json = JSON.stringify({ name: 'gzipped' });
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: { ...bearer(token), 'content-type': 'application/json', 'content-encoding': 'gzip' }, payload: gzipSync(json) });
    expect(res.statusCode).toBe(415);
    expect(res.json()).toEqual({ name: 'unsupported_media_type', message: expect.stringContaining('Content-Encoding gzip'), statusCode: 415 });
    const plain = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: { ...bearer(token), 'content-type': 'application/json', 'content-encoding': 'identity' }, payload: json });
    expect(plain.statusCode).toBe(200);
    // The header alone, on a request without a body, refuses nothing.
    const read = await ctx.app.inject({ method: 'GET', url: '/api/v2/tokens', headers: { ...bearer(token), 'content-encoding': 'gzip' } });
    expect(read.statusCode).toBe(200);
  });

  it('accepts JSON with a charset', async () => {
    const res = await postTokens(JSON.stringify({ name: 'charset' }), 'application/json; charset=utf-8');
    expect(res.statusCode).toBe(200);
  });

  it('accepts a body of exactly 1 MiB and refuses one byte more with 413 payload_too_large', async () => {
    // Padded with JSON whitespace: an unknown field would be refused (422) on its own.
    const body = (size: number) => {
      const head = '{"name":"big"';
      return Buffer.from(head + ' '.repeat(size - head.length - 1) + '}');
    };
    expect(body(BODY_LIMIT).length).toBe(1024 * 1024);
    expect((await postTokens(body(BODY_LIMIT), 'application/json')).statusCode).toBe(200);
    const res = await postTokens(body(BODY_LIMIT + 1), 'application/json');
    expect(res.statusCode).toBe(413);
    expect(res.json()).toEqual({ name: 'payload_too_large', message: expect.any(String), statusCode: 413 });
  });

  it.each([
    ['GET', '/nope', {}],
    ['GET', '/api/v2/nope', {}],
    ['GET', '/api/v2/nope', 'token'],
    ['DELETE', '/api/v2/tokens', 'token'],
    ['POST', '/healthz', {}],
    ['GET', '/api/v3/tokens', 'token'],
  ])('answers 404 not_found to %s %s', async (method, url, auth) => {
    const res = await ctx.app.inject({ method: method as 'GET', url, headers: auth === 'token' ? bearer(token) : {} });
    expect(res.statusCode).toBe(404);
    expect(res.json()).toEqual({ name: 'not_found', message: expect.stringContaining(url), statusCode: 404 });
  });

  it('writes nothing when a request is refused', async () => {
    const before = (await ctx.app.inject({ url: '/api/v2/tokens?limit=100', headers: bearer(token) })).json().data.length;
    await postTokens('{"name":"half"', 'application/json');
    await postTokens('name=half', 'text/plain');
    await postTokens(JSON.stringify({ name: 'half', preset: 'app', permissions: ['emails'] }), 'application/json');
    const after = (await ctx.app.inject({ url: '/api/v2/tokens?limit=100', headers: bearer(token) })).json();
    expect(after.data.length).toBe(before);
    expect(after.data.some((t: { name: string }) => t.name === 'half')).toBe(false);
  });

  it('echoes a request id, or makes one', async () => {
    const given = await ctx.app.inject({ url: '/healthz', headers: { 'x-request-id': 'abc-123' } });
    expect(given.headers['x-request-id']).toBe('abc-123');
    const made = await ctx.app.inject({ url: '/healthz', headers: { 'x-request-id': 'not valid!' } });
    expect(made.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('internal errors (docs/foundation.md "Errors": 500 internal_error)', () => {
  let app: App;

  beforeAll(async () => {
    // The real app and error handler, with three routes that fail the ways code does.
    app = await buildApp(ctx.services);
    app.get('/test/sql', async (request) => {
      await request.em.execute("select password from no_such_table where secret = 'hunter2'");
      return {};
    });
    app.get('/test/throw', async () => {
      throw new Error('cannot read /etc/mailroom/private.key: EACCES');
    });
    app.get('/test/serialization', { schema: { response: { 200: z.object({ id: z.string() }) } } }, async () => {
      return { id: 42 } as unknown as { id: string };
    });
    await app.ready();
  });
  afterAll(async () => app?.close());

  it.each(['/test/sql', '/test/throw', '/test/serialization'])('%s answers 500 with no internals', async (url) => {
    const res = await app.inject({ url });
    expect(res.statusCode).toBe(500);
    expect(res.json()).toEqual({ name: 'internal_error', message: 'Internal error', statusCode: 500 });
    expect(res.body).not.toMatch(/select|no_such_table|hunter2|private\.key|EACCES|\bat\s|\.ts:\d+/i);
  });
});

describe('dependencies down (docs/operations.md "When PostgreSQL or Redis goes away": 503 service_unavailable)', () => {
  async function servicesWith(overrides: Record<string, string>): Promise<{ services: Services; app: App; close(): Promise<void> }> {
    const config = loadConfig({ ...ctx.env.env, ...overrides });
    const services = await createServices(config, createLogger({ level: 'silent' }));
    const app = await buildApp(services);
    await app.ready();
    return {
      services,
      app,
      async close() {
        await app.close();
        await closeServices(services);
      },
    };
  }

  async function timed(app: App, url: string) {
    const started = Date.now();
    const res = await app.inject({ url, headers: bearer(token) });
    return { res, ms: Date.now() - started };
  }

  function expectUnavailable(res: Awaited<ReturnType<App['inject']>>) {
    expect(res.statusCode).toBe(503);
    expect(res.json()).toEqual({ name: 'service_unavailable', message: expect.any(String), statusCode: 503 });
    expect(res.headers['retry-after']).toBe('5');
  }

  /** The dashboard's sign-in, which reads both: its page says so, with the same status and Retry-After. */
  async function expectDashboardUnavailable(app: App) {
    const res = await app.inject({ method: 'POST', url: '/app/login', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: 'email=ops%40acme.test&password=secret-password' });
    expect(res.statusCode).toBe(503);
    expect(res.headers['retry-after']).toBe('5');
    expect(res.body).toContain('cannot reach its database or queue');
  }

  it('answers 503 at once when Redis is unreachable, and /readyz names redis', async () => {
    const down = await servicesWith({ REDIS_URL: `redis://127.0.0.1:${await closedPort()}` });
    try {
      const { res, ms } = await timed(down.app, '/api/v2/tokens');
      expectUnavailable(res);
      expect(ms).toBeLessThan(3_000);
      const ready = await down.app.inject({ url: '/readyz' });
      expect(ready.statusCode).toBe(503);
      expect(ready.json()).toMatchObject({ name: 'service_unavailable', message: expect.stringContaining('redis'), checks: { postgres: 'up', redis: 'down' } });
      expect((await down.app.inject({ url: '/healthz' })).statusCode).toBe(200);
      await expectDashboardUnavailable(down.app);
    } finally {
      await down.close();
    }
  });

  it('answers 503 at once when PostgreSQL is unreachable, and /readyz names postgres', async () => {
    const url = new URL(ctx.env.config.databaseUrl);
    url.port = String(await closedPort());
    const down = await servicesWith({ DATABASE_URL: url.toString() });
    try {
      const { res, ms } = await timed(down.app, '/api/v2/tokens');
      expectUnavailable(res);
      expect(ms).toBeLessThan(3_000);
      const ready = await down.app.inject({ url: '/readyz' });
      expect(ready.statusCode).toBe(503);
      expect(ready.json()).toMatchObject({ message: expect.stringContaining('postgres'), checks: { postgres: 'down', redis: 'up' } });
      await expectDashboardUnavailable(down.app);
    } finally {
      await down.close();
    }
  });

  it('answers 503 when Redis goes away while running, and recovers when it returns', async () => {
    const redisUrl = new URL(ctx.env.config.redisUrl);
    const proxy = await new TcpProxy(redisUrl.hostname, Number(redisUrl.port || 6379)).start();
    const running = await servicesWith({ REDIS_URL: `redis://127.0.0.1:${proxy.port}` });
    try {
      expect((await timed(running.app, '/api/v2/tokens')).res.statusCode).toBe(200);
      await proxy.cut();
      // The rate limiter may still hold part of this second's window reserved in Redis
      // (src/api/plugins/auth.ts); the next second needs Redis again.
      await sleep(1000 - (Date.now() % 1000) + 10);
      const { res, ms } = await timed(running.app, '/api/v2/tokens');
      expectUnavailable(res);
      expect(ms).toBeLessThan(3_000);
      expect((await running.app.inject({ url: '/readyz' })).json().checks.redis).toBe('down');
      await proxy.restore();
      await expect.poll(async () => (await timed(running.app, '/api/v2/tokens')).res.statusCode, { timeout: 10_000, interval: 100 }).toBe(200);
    } finally {
      await running.close();
      await proxy.cut();
    }
  });

  it('answers 503 when PostgreSQL goes away while running, and recovers when it returns', async () => {
    const dbUrl = new URL(ctx.env.config.databaseUrl);
    const proxy = await new TcpProxy(dbUrl.hostname, Number(dbUrl.port || 5432)).start();
    dbUrl.hostname = '127.0.0.1';
    dbUrl.port = String(proxy.port);
    const running = await servicesWith({ DATABASE_URL: dbUrl.toString() });
    try {
      expect((await timed(running.app, '/api/v2/domains')).res.statusCode).toBe(200);
      await proxy.cut();
      // The token is cached, so the request reaches the handler and its query fails (the
      // token list itself is cached too: domains are read from PostgreSQL every time).
      const { res, ms } = await timed(running.app, '/api/v2/domains');
      expectUnavailable(res);
      expect(ms).toBeLessThan(6_000);
      expect((await running.app.inject({ url: '/readyz' })).json().checks.postgres).toBe('down');
      await proxy.restore();
      await expect.poll(async () => (await timed(running.app, '/api/v2/domains')).res.statusCode, { timeout: 10_000, interval: 100 }).toBe(200);
    } finally {
      await running.close();
      await proxy.cut();
    }
  });
});

describe('error bodies', () => {
  it('carry exactly name, message, statusCode (and details on validation)', async () => {
    const res = await postTokens(JSON.stringify({ name: '' }), 'application/json');
    expect(Object.keys(res.json()).sort()).toEqual([...ERROR_KEYS, 'details'].sort());
    const unauthorized = await ctx.app.inject({ url: '/api/v2/tokens' });
    expect(Object.keys(unauthorized.json()).sort()).toEqual(ERROR_KEYS);
  });
});

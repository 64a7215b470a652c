import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import type { FastifyRequest } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dispatch } from '../src/api/tools/dispatch.js';
import { isDependencyDown } from '../src/shared/dependency-errors.js';
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
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- the tests read any field of the parsed answer
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

describe('malformed path parameters, query strings and bodies (docs/foundation.md "Errors")', () => {
  const PARAM_ROUTES: Array<[string, string, object?]> = [
    ['GET', '/api/v2/subscribers/{}'],
    ['PATCH', '/api/v2/subscribers/{}', { name: 'n' }],
    ['POST', '/api/v2/subscribers/{}/unsubscribe', {}],
    ['POST', '/api/v2/subscribers/{}/tags', { tags: ['a'] }],
    ['DELETE', '/api/v2/subscribers/{}/tags', { tags: ['a'] }],
    ['GET', '/api/v2/subscribers/{}/events'],
    ['GET', '/api/v2/tags/{}'],
    ['PATCH', '/api/v2/tags/{}', { name: 'n' }],
    ['GET', '/api/v2/campaigns/{}'],
    ['PATCH', '/api/v2/campaigns/{}', { name: 'n' }],
    ['DELETE', '/api/v2/campaigns/{}'],
    ['POST', '/api/v2/campaigns/{}/send', {}],
    ['POST', '/api/v2/campaigns/{}/test', { to: 'a@example.com' }],
    ['GET', '/api/v2/emails/{}'],
    ['GET', '/api/v2/domains/{}'],
    ['POST', '/api/v2/domains/{}/verify'],
    ['DELETE', '/api/v2/domains/{}'],
    ['GET', '/api/v2/senders/{}'],
  ];
  const MALFORMED = [
    ['a NUL character', 'a%00b'],
    ['an encoded NUL in an address', 'jane%40example.com%00'],
    ['invalid percent-encoding', '%FF'],
    ['a truncated escape', '%E0%A4%A'],
    ['an id over every limit', 'x'.repeat(3000)],
    ['an id longer than its schema allows', `cmp_${'z'.repeat(400)}`],
  ];

  it.each(MALFORMED)('answers 404 not_found in the spec shape to %s in any path parameter', async (_label, value) => {
    for (const [method, pattern, payload] of PARAM_ROUTES) {
      const url = pattern.replace('{}', value);
      const res = await ctx.app.inject({ method: method as 'GET', url, headers: bearer(acme.token), ...(payload ? { payload } : {}) });
      expect({ method, pattern, status: res.statusCode }).toEqual({ method, pattern, status: 404 });
      expectErrorShape(res.json(), 404, 'not_found');
      expect(res.headers['x-request-id']).toBeTruthy();
    }
  });

  it('answers a request the HTTP parser refuses (raw UTF-8 in the URL, a broken header) in the error shape', async () => {
    const { port } = new URL(baseUrl);
    const send = (head: Buffer) =>
      new Promise<string>((resolve, reject) => {
        const socket = connect(Number(port), '127.0.0.1', () => socket.end(head));
        let text = '';
        socket.on('data', (chunk) => (text += chunk.toString('utf8')));
        socket.on('close', () => resolve(text));
        socket.on('error', reject);
      });
    const cases: Array<[Buffer, string, number, string, RegExp]> = [
      [Buffer.concat([Buffer.from('GET /api/v2/subscribers?query=zo'), Buffer.from([0xc3, 0xab]), Buffer.from(' HTTP/1.1\r\nHost: x\r\n\r\n')]), 'Bad Request', 400, 'bad_request', /percent-encoded/],
      [Buffer.from('GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n'), 'Bad Request', 400, 'bad_request', /headers well formed/],
      [Buffer.from('POST /api/v2/tokens HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n'), 'Bad Request', 400, 'bad_request', /body framing/],
      [Buffer.from(`GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`), 'Request Header Fields Too Large', 431, 'headers_too_large', /headers are larger/],
    ];
    for (const [head, text, status, name, message] of cases) {
      const answer = await send(head);
      expect(answer.split('\r\n')[0], name).toBe(`HTTP/1.1 ${status} ${text}`);
      const body = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4));
      expectErrorShape(body, status, name);
      expect(body.message).toMatch(message);
    }
  });

  it('wraps a malformed v1 path in the v1 envelope', async () => {
    const res = await ctx.app.inject({ url: '/api/v1/subscribers/%FF', headers: bearer(acme.token) });
    expect(res.statusCode).toBe(404);
    expect(res.json()).toMatchObject({ success: false, error: { name: 'not_found', statusCode: 404 } });
  });

  it('finds a subscriber by an address longer than 100 characters', async () => {
    const email = `${'a'.repeat(30)}.${'b'.repeat(30)}@${'c'.repeat(60)}.${'d'.repeat(40)}.example.com`;
    const created = await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(acme.token), payload: { email } });
    expect(created.statusCode).toBe(200);
    const res = await ctx.app.inject({ url: `/api/v2/subscribers/${encodeURIComponent(email)}`, headers: bearer(acme.token) });
    expect(res.statusCode).toBe(200);
    expect(res.json().email).toBe(email);
  });

  it.each([
    ['GET', '/api/v2/subscribers?tag=a%00b', undefined, 422, 'tag'],
    ['GET', '/api/v2/subscribers?query=%00', undefined, 422, 'query'],
    ['GET', '/api/v2/emails?after=eml_%00', undefined, 422, 'after'],
    ['GET', '/api/v2/campaigns?after=cmp_%00', undefined, 422, 'after'],
    ['POST', '/api/v2/subscribers', { email: 'a@example.com', name: 'x\u0000' }, 422, 'name'],
    ['POST', '/api/v2/subscribers', { email: 'a@example.com', fields: { 'k\u0000': 'v' } }, 422, 'fields.k\\0'],
    ['POST', '/api/v2/subscribers', { email: 'a@example.com', tags: ['ok', 'b\u0000d'] }, 422, 'tags.1'],
    ['POST', '/api/v2/tags', { name: '\u0000' }, 422, 'name'],
    ['POST', '/api/v2/verify', { email: 'a\u0000@example.com' }, 422, 'email'],
    ['POST', '/api/v2/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'a\u0000', data: { amount: 1 } }, 400, 'subscriber'],
    ['POST', '/api/v2/emails', { from: 'a@acme.test', to: 'b@example.com', subject: 'Hi', markdown: 'x\u0000' }, 422, 'markdown'],
    ['POST', '/api/v2/campaigns', { name: 'c', subject: 's\u0000' }, 422, 'subject'],
  ])('refuses U+0000 in %s %s with the spec\'s validation error', async (method, url, payload, status, path) => {
    const res = await ctx.app.inject({ method: method as 'GET', url, headers: bearer(acme.token), ...(payload ? { payload } : {}) });
    expect(res.statusCode).toBe(status);
    const body = res.json();
    expectErrorShape(body, status, 'validation_error');
    expect(body.details).toEqual([{ path, message: expect.stringContaining('NUL') }]);
  });

  it.each([
    ['POST', '/api/v2/verify', { email: 'x\ud800@example.org' }, 422, 'email'],
    ['POST', '/api/v2/subscribers', { email: 'sur@example.org', fields: { city: 'a\ud800b' } }, 422, 'fields.city'],
    ['POST', '/api/v2/subscribers', { email: 'sur@example.org', tags: ['a\udc00b'] }, 422, 'tags.0'],
    ['POST', '/api/v2/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'sur@example.org', data: { amount: 1, note: 'a\ud800' } }, 400, 'data.note'],
    ['POST', '/api/v2/campaigns', { name: 'c', subject: 's', contentType: 'MAILY', content: { type: 'doc', content: [{ type: 'paragraph', content: [{ type: 'text', text: 'a\ud800' }] }] } }, 422, 'content.content.0.content.0.text'],
  ])('refuses an unpaired surrogate in %s %s (jsonb cannot store it) with the validation error, not a 500', async (method, url, payload, status, path) => {
    const before = await ctx.services.orm.em.fork().execute<{ n: number }[]>(`select count(*)::int as n from email_verifications`);
    const res = await ctx.app.inject({ method: method as 'POST', url, headers: bearer(acme.token), payload });
    expect(res.statusCode).toBe(status);
    expect(res.json().details).toEqual([{ path, message: expect.stringContaining('surrogate') }]);
    // Refused before the handler: a verification is neither made nor counted.
    expect(await ctx.services.orm.em.fork().execute<{ n: number }[]>(`select count(*)::int as n from email_verifications`)).toEqual(before);
  });

  it('refuses a document given as JSON text whose parsed text holds U+0000 or an unpaired surrogate (escaped in the text)', async () => {
    const docText = (text: string) => JSON.stringify({ type: 'doc', content: [{ type: 'paragraph', content: [{ type: 'text', text }] }] });
    const count = async () => (await ctx.services.orm.em.fork().execute<{ n: number }[]>(`select (select count(*) from emails) + (select count(*) from campaigns) as n`))[0]!.n;
    const before = await count();
    for (const text of ['a\u0000b', 'a\ud800b']) {
      // JSON.stringify escapes both: the request's own text holds only `\u0000` or `\ud800`, six characters.
      expect(docText(text)).toMatch(/\\u(0000|d800)/);
      const cases: [string, object, number, string][] = [
        ['/api/v2/emails', { from: 'a@acme.test', to: 'b@example.com', subject: 'Hi', tiptap: docText(text) }, 422, 'tiptap'],
        ['/api/v1/emails', { from: 'a@acme.test', to: 'b@example.com', subject: 'Hi', contentType: 'TIPTAP', content: docText(text) }, 422, 'content'],
        ['/api/v2/campaigns', { name: 'c', subject: 's', contentType: 'MAILY', content: docText(text) }, 422, 'content'],
      ];
      for (const [url, payload, status, path] of cases) {
        const res = await ctx.app.inject({ method: 'POST', url, headers: bearer(acme.token), payload });
        expect({ url, status: res.statusCode }).toEqual({ url, status });
        const body = url.startsWith('/api/v1') ? res.json().error : res.json();
        expect(body.details).toEqual([{ path, message: expect.stringMatching(/NUL character .* at content\.0\.content\.0\.text/) }]);
      }
    }
    expect(await count()).toBe(before);
  });

  it('answers a tool argument with an unpaired surrogate with the validation error naming it, not a 500', async () => {
    const answer = await runOverHttp(ctx, acme.token, 'get_email', { id: 'eml_\ud800' });
    expect(answer.statusCode).toBe(422);
    expect(answer.body).toMatchObject({ name: 'validation_error', details: [{ path: 'arguments.id', message: expect.stringContaining('surrogate') }] });
  });

  it('answers a tool argument holding U+0000 with the endpoint\'s validation error', async () => {
    const answer = await runOverHttp(ctx, acme.token, 'get_subscriber', { subscriber: 'a\u0000b' });
    expect(answer.statusCode).toBe(422);
    expect(answer.body).toMatchObject({ name: 'validation_error', details: [{ path: 'arguments.subscriber' }] });
  });

  it('checks the provider webhook signature before the NUL check', async () => {
    const res = await ctx.app.inject({ method: 'POST', url: '/webhooks/provider', payload: { type: 'delivered', messageId: 'a\u0000b' } });
    expect(res.statusCode).toBe(401);
  });

  it('does not take a refused statement for an unreachable database', () => {
    // 08P01: PostgreSQL refused one message (e.g. a NUL in a text parameter); the connection works.
    expect(isDependencyDown(Object.assign(new Error('invalid message format'), { code: '08P01' }))).toBe(false);
    expect(isDependencyDown(Object.assign(new Error('connection failure'), { code: '08006' }))).toBe(true);
    // The database of DATABASE_URL does not exist: 503 as /readyz says, not a 500.
    expect(isDependencyDown(Object.assign(new Error('database "x" does not exist'), { code: '3D000' }))).toBe(true);
  });
});

describe('401 challenges (RFC 6750)', () => {
  const missing = 'Bearer realm="mailroom"';
  const invalid = /^Bearer realm="mailroom", error="invalid_token"/;
  const unknownToken = `svc_${'0'.repeat(64)}`;

  it('answers WWW-Authenticate: Bearer on every 401 of the API', async () => {
    const requests: Array<{ method: 'GET' | 'POST'; url: string; payload?: object }> = [
      { method: 'GET', url: '/api/v2/tokens' },
      { method: 'GET', url: '/api/v2/tools' },
      { method: 'POST', url: '/api/v2/tools/list_domains', payload: { arguments: {} } },
      { method: 'GET', url: '/api/v1/subscribers' },
    ];
    for (const request of requests) {
      const none = await ctx.app.inject(request);
      expect({ url: request.url, status: none.statusCode, challenge: none.headers['www-authenticate'] }).toEqual({ url: request.url, status: 401, challenge: missing });
      const bad = await ctx.app.inject({ ...request, headers: bearer(unknownToken) });
      expect(bad.statusCode).toBe(401);
      expect(bad.headers['www-authenticate']).toMatch(invalid);
    }
  });

  it('answers WWW-Authenticate: Bearer on a 401 of /mcp', async () => {
    const initialize = {
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    };
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
    const none = await fetch(`${baseUrl}/mcp`, { method: 'POST', headers, body: JSON.stringify(initialize) });
    expect(none.status).toBe(401);
    expect(none.headers.get('www-authenticate')).toBe(missing);
    expectErrorShape((await none.json()) as Record<string, unknown>, 401, 'missing_api_key');
    const bad = await fetch(`${baseUrl}/mcp`, { method: 'POST', headers: { ...headers, ...bearer(unknownToken) }, body: JSON.stringify(initialize) });
    expect(bad.status).toBe(401);
    expect(bad.headers.get('www-authenticate')).toMatch(invalid);
  });

  it('sends no challenge with a 403', async () => {
    const minted = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(acme.token), payload: { name: 'subs only', permissions: ['subscribers'] } });
    const res = await ctx.app.inject({ url: '/api/v2/domains', headers: bearer(minted.json().token) });
    expect(res.statusCode).toBe(403);
    expect(res.headers['www-authenticate']).toBeUndefined();
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { McpClients, runBoth, runOverHttp, runOverMcp } from './helpers/agents.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { VERIFICATION_ZONE } from './helpers/verification-fixtures.js';

let ctx: TestContext;
let clients: McpClients;
let token: string;
let otherToken: string;
let baseUrl: string;
let dns: TestDnsServer;

const REQUIRED_TOOLS = [
  'verify_email',
  'send_email',
  'get_email',
  'list_emails',
  'create_subscriber',
  'get_subscriber',
  'update_subscriber',
  'unsubscribe_subscriber',
  'list_campaigns',
  'get_campaign',
  'schedule_campaign',
  'list_domains',
];

beforeAll(async () => {
  dns = await startDnsServer(VERIFICATION_ZONE);
  ctx = await createTestContext({ DNS_SERVERS: dns.address });
  ({ token } = await createOrg(ctx.services));
  ({ token: otherToken } = await createOrg(ctx.services, { name: 'Other' }));
  baseUrl = await ctx.app.listen({ host: '127.0.0.1', port: 0 });
  clients = new McpClients(baseUrl);
});
afterAll(async () => {
  await clients?.close();
  await ctx?.close();
  await dns?.close();
});

function v2(method: 'GET' | 'POST' | 'PATCH', url: string, payload?: object, as = token) {
  return ctx.app.inject({ method, url, headers: bearer(as), ...(payload ? { payload } : {}) });
}

async function mint(permissions: string[], name = permissions.join('+')): Promise<string> {
  const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(token), payload: { name, permissions } });
  expect(res.statusCode).toBe(200);
  return res.json().token;
}

describe('GET /api/v2/tools', () => {
  it('lists every tool with a JSON Schema and the permission its endpoint asks', async () => {
    const res = await ctx.app.inject({ method: 'GET', url: '/api/v2/tools', headers: bearer(token) });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toMatchObject({ object: 'list', has_more: false });
    const names = body.data.map((tool: { name: string }) => tool.name);
    expect(names).toEqual(expect.arrayContaining(REQUIRED_TOOLS));
    for (const tool of body.data) {
      expect(Object.keys(tool).sort()).toEqual(['description', 'inputSchema', 'name', 'permission']);
      expect(tool.description.length).toBeGreaterThan(10);
      expect(tool.inputSchema.type).toBe('object');
      // Every tool refuses arguments it does not name, and says so.
      expect(tool.inputSchema.additionalProperties, tool.name).toBe(false);
    }
    const byName = Object.fromEntries(body.data.map((tool: { name: string }) => [tool.name, tool]));
    expect(byName.verify_email).toMatchObject({ permission: 'emails', inputSchema: { required: ['email'] } });
    expect(byName.schedule_campaign.permission).toBe('send');
    expect(byName.schedule_campaign.inputSchema.required).toEqual(['campaignId']);
    expect(byName.list_domains.permission).toBe('domains');
    expect(byName.update_subscriber.inputSchema.required).toEqual(['subscriber']);
  });

  it('refuses an unknown argument before dispatch, naming it, and the endpoint counts nothing', async () => {
    const remaining = async () => Number((await ctx.app.inject({ url: '/api/v2/domains', headers: bearer(token) })).headers['ratelimit-remaining']);
    for (const [name, args] of [
      ['verify_email', { email: 'jane@example.com', colour: 1 }],
      ['create_subscriber', { email: 'a@example.org', colour: 1 }],
      ['send_email', { from: 'me@acme.test', to: 'x@example.org', subject: 'hi', markdown: 'hi', colour: 1 }],
    ] as const) {
      await new Promise((resolve) => setTimeout(resolve, 1_000 - (Date.now() % 1_000) + 5));
      const before = await remaining();
      const res = await ctx.app.inject({ method: 'POST', url: `/api/v2/tools/${name}`, headers: bearer(token), payload: { arguments: args } });
      expect(res.statusCode, name).toBe(422);
      expect(res.json().details, name).toEqual([{ path: 'arguments', message: expect.stringContaining('"colour" is not a field') }]);
      // Only the probe itself was counted since: the refused call was not dispatched.
      expect(await remaining(), name).toBe(before - 1);
    }
  });

  it('answers any valid token, whatever its permissions', async () => {
    const narrow = await mint(['domains'], 'catalog reader');
    const res = await ctx.app.inject({ method: 'GET', url: '/api/v2/tools', headers: bearer(narrow) });
    expect(res.statusCode).toBe(200);
    expect(res.json().data.length).toBeGreaterThanOrEqual(REQUIRED_TOOLS.length);
  });

  it('answers with the X-Request-Id and the rate limit headers of any API answer', async () => {
    const res = await fetch(`${baseUrl}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...bearer(token) },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-request-id')).toBeTruthy();
    // tools/list dispatches nothing: the POST itself is counted, and says so.
    expect(res.headers.get('ratelimit-limit')).toBeTruthy();
  });

  it('is 401 missing_api_key without a valid token', async () => {
    for (const headers of [{}, bearer('svc_' + '0'.repeat(64))]) {
      const res = await ctx.app.inject({ method: 'GET', url: '/api/v2/tools', headers });
      expect(res.statusCode).toBe(401);
      expect(res.json()).toMatchObject({ name: 'missing_api_key', statusCode: 401 });
    }
  });
});

describe('POST /api/v2/tools/{name}', () => {
  it('is 401 without a token, before anything else', async () => {
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tools/nope', payload: { arguments: {} } });
    expect(res.statusCode).toBe(401);
    expect(res.json().name).toBe('missing_api_key');
  });

  it('is 404 not_found for an unknown tool', async () => {
    const res = await runBoth(ctx, clients, token, 'delete_everything', {});
    expect(res.statusCode).toBe(404);
    expect(res.body).toMatchObject({ name: 'not_found', statusCode: 404 });
  });

  it('is 422 validation_error naming the argument that fails the schema', async () => {
    const res = await runBoth(ctx, clients, token, 'list_domains', { limit: 0 });
    expect(res.statusCode).toBe(422);
    expect(res.body).toMatchObject({ name: 'validation_error', details: [{ path: 'arguments.limit' }] });
    const missing = await runBoth(ctx, clients, token, 'get_subscriber', {});
    expect(missing.statusCode).toBe(422);
    expect(missing.body).toMatchObject({ details: [{ path: 'arguments.subscriber' }] });
  });

  it('takes a missing arguments object as no arguments', async () => {
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tools/list_domains', headers: bearer(token), payload: {} });
    expect(res.statusCode).toBe(200);
  });
});

describe('list_domains', () => {
  it('answers what GET /api/v2/domains answers', async () => {
    for (const domain of ['one.example', 'two.example']) {
      const created = await ctx.app.inject({ method: 'POST', url: '/api/v2/domains', headers: bearer(token), payload: { domain } });
      expect(created.statusCode).toBe(200);
    }
    const direct = await ctx.app.inject({ method: 'GET', url: '/api/v2/domains?limit=1', headers: bearer(token) });
    const res = await runBoth(ctx, clients, token, 'list_domains', { limit: 1 });
    expect(res).toEqual({ statusCode: 200, body: direct.json() });
    expect(direct.json()).toMatchObject({ has_more: true, data: [expect.objectContaining({ domain: expect.any(String) })] });
  });

  it('get_domain answers what GET /api/v2/domains/{domain} answers', async () => {
    const direct = await v2('GET', '/api/v2/domains/one.example');
    expect(direct.statusCode).toBe(200);
    expect(await runBoth(ctx, clients, token, 'get_domain', { domain: 'one.example' })).toEqual({ statusCode: 200, body: direct.json() });
    expect(await runBoth(ctx, clients, token, 'get_domain', { domain: direct.json().id })).toEqual({ statusCode: 200, body: direct.json() });
    expect(await runBoth(ctx, clients, otherToken, 'get_domain', { domain: 'one.example' })).toMatchObject({ statusCode: 404, body: { name: 'not_found' } });
  });

  it("shows only the caller's organization", async () => {
    const res = await runBoth(ctx, clients, otherToken, 'list_domains', {});
    expect(res.body).toEqual({ object: 'list', has_more: false, data: [] });
  });

  it("answers the endpoint's 403 when the token lacks the permission", async () => {
    const narrow = await mint(['emails'], 'no domains');
    const res = await runBoth(ctx, clients, narrow, 'list_domains', {});
    expect(res.statusCode).toBe(403);
    expect(res.body).toMatchObject({ name: 'missing_permission', statusCode: 403 });
  });
});

describe('rate limit', () => {
  it('counts a tool call once, as its endpoint request, and passes its headers on', async () => {
    const remaining = async () => {
      const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tools/list_domains', headers: bearer(token), payload: { arguments: {} } });
      expect(res.headers['ratelimit-limit']).toBe('10000');
      return Number(res.headers['ratelimit-remaining']);
    };
    // Two calls within one rate-limit second differ by one; a pair across a second boundary
    // starts over, so try a few pairs.
    for (let attempt = 0; attempt < 5; attempt += 1) {
      const first = await remaining();
      const second = await remaining();
      if (second < first) {
        expect(first - second).toBe(1);
        return;
      }
    }
    throw new Error('no two calls fell in the same second');
  });
});

describe('tool schemas say what the tools refuse', () => {
  it('one body field of send_email, the event types and URL scheme of create_webhook, a country code, the list filters', async () => {
    type Schema = { oneOf?: unknown; properties: Record<string, { pattern: string; items: { enum: string[] }; minLength?: number; maxLength?: number }> };
    const catalog = (await ctx.app.inject({ method: 'GET', url: '/api/v2/tools', headers: bearer(token) })).json().data as { name: string; inputSchema: Schema }[];
    const schema = (name: string) => catalog.find((tool) => tool.name === name)!.inputSchema;
    expect(schema('send_email').oneOf).toEqual([{ required: ['html'] }, { required: ['markdown'] }, { required: ['tiptap'] }]);
    const webhook = schema('create_webhook').properties;
    expect(webhook.events.items.enum).toEqual(expect.arrayContaining(['email.sent', 'contact.created', '*']));
    expect(new RegExp(webhook.url.pattern).test('ftp://x')).toBe(false);
    expect(new RegExp(webhook.url.pattern).test('HTTPS://x')).toBe(true);
    expect(new RegExp(schema('create_subscriber').properties.country.pattern).test('XXX')).toBe(false);
    // The list tools take the endpoint's own filters: a bad one is refused naming the argument.
    expect(schema('list_subscribers').properties.tag).toMatchObject({ minLength: 1, maxLength: 100 });
    const refused = await runOverHttp(ctx, token, 'list_subscribers', { tag: '' });
    expect(refused).toMatchObject({ statusCode: 422, body: { details: [{ path: 'arguments.tag' }] } });
    for (const [name, args, path] of [
      ['list_webhook_deliveries', { webhookId: 'whk_x', before: '' }, 'arguments.before'],
      ['list_webhooks', { after: '' }, 'arguments.after'],
      ['list_campaigns', { after: 'c'.repeat(101) }, 'arguments.after'],
    ] as const) {
      expect(await runOverHttp(ctx, token, name, args), name).toMatchObject({ statusCode: 422, body: { details: [{ path }] } });
    }
  });
});

describe('MCP at /mcp', () => {
  it('answers a body the HTTP layer refuses (not JSON, not JSON\'s type, too large) as JSON-RPC errors', async () => {
    const post = (payload: string, contentType = 'application/json') =>
      ctx.app.inject({ method: 'POST', url: '/mcp', headers: { ...bearer(token), 'content-type': contentType, accept: 'application/json, text/event-stream' }, payload });
    const broken = await post('{"jsonrpc":"2.0","id":1,"method":"tools/list"');
    expect(broken.statusCode).toBe(400);
    expect(broken.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32700 }, id: null });
    const text = await post('{"jsonrpc":"2.0","id":1,"method":"tools/list"}', 'text/plain');
    expect(text.statusCode).toBe(415);
    expect(text.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32600 }, id: null });
    const huge = await post(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: { pad: 'x'.repeat(2 * 1024 * 1024) } }));
    expect(huge.statusCode).toBe(413);
    expect(huge.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32600 }, id: null });
    // JSON the service does not take (prototype poisoning, nested past 512 levels): no request either.
    for (const payload of ['{"jsonrpc":"2.0","id":1,"method":"tools/list","__proto__":{}}', `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":${'['.repeat(600)}${']'.repeat(600)}}`]) {
      const refused = await post(payload);
      expect(refused.statusCode).toBe(422);
      expect(refused.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32600 }, id: null });
    }
  });

  it('answers a tools/call that is not a call (no tool name, arguments not an object) -32602 naming the param', async () => {
    const post = (payload: object) =>
      ctx.app.inject({ method: 'POST', url: '/mcp', headers: { ...bearer(token), 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, payload });
    const cases: [object | undefined, string][] = [
      [{ arguments: {} }, 'params.name: is required'],
      [{ name: 'list_domains', arguments: 'x' }, 'params.arguments: must be an object, got a string'],
      [{ name: 7 }, 'params.name: must be a string, got a whole number'],
      [undefined, 'params: is required'],
    ];
    for (const [params, message] of cases) {
      const res = await post({ jsonrpc: '2.0', id: 9, method: 'tools/call', ...(params ? { params } : {}) });
      expect(res.statusCode).toBe(200);
      expect(res.json()).toEqual({ jsonrpc: '2.0', id: 9, error: { code: -32602, message } });
    }
    // In a batch, the other calls run as usual (params that are not even an object included).
    const batch = await post([
      { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { arguments: {} } },
      { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'list_domains', arguments: {} } },
      { jsonrpc: '2.0', id: 3, method: 'tools/call', params: 'x' },
    ]);
    const answers = batch.json() as { id: number; error?: { code: number }; result?: { isError?: boolean } }[];
    expect(answers.find((a) => a.id === 1)).toMatchObject({ error: { code: -32602, message: 'params.name: is required' } });
    expect(answers.find((a) => a.id === 2)?.result).toMatchObject({ structuredContent: { object: 'list' } });
    expect(answers.find((a) => a.id === 3)).toMatchObject({ error: { code: -32602, message: 'params: must be an object, got a string' } });
  });

  it('answers JSON that is no JSON-RPC message, an empty batch or one whose requests repeat an id, -32600 (not -32700, which is for a body that is not JSON)', async () => {
    const twice = (id: number) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'list_domains', arguments: {} } });
    for (const payload of [[], { id: 1, method: 'ping' }, { jsonrpc: '1.0', id: 1, method: 'ping' }, [1], 'str', { jsonrpc: '2.0', id: 1 }, [twice(1), twice(1)]]) {
      const res = await ctx.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: { ...bearer(token), 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        payload: JSON.stringify(payload),
      });
      expect({ payload, status: res.statusCode }).toEqual({ payload, status: 400 });
      expect(res.json()).toMatchObject({ jsonrpc: '2.0', error: { code: -32600, message: expect.stringMatching(/^Invalid Request/) }, id: null });
    }
  });

  it('a tools/call answer carries the endpoint\'s rate-limit headers', async () => {
    const res = await ctx.app.inject({
      method: 'POST',
      url: '/mcp',
      headers: { ...bearer(token), 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      payload: { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'list_domains', arguments: {} } },
    });
    expect(res.statusCode).toBe(200);
    expect(res.headers['ratelimit-limit']).toMatch(/^\d+$/);
    expect(res.headers['ratelimit-remaining']).toMatch(/^\d+$/);
  });

  it('lists the same catalog with read-only and destructive annotations', async () => {
    const client = await clients.for(token);
    const { tools } = await client.listTools();
    const catalog = (await ctx.app.inject({ method: 'GET', url: '/api/v2/tools', headers: bearer(token) })).json().data;
    expect(tools.map((tool) => tool.name)).toEqual(catalog.map((tool: { name: string }) => tool.name));
    for (const tool of tools) {
      const twin = catalog.find((entry: { name: string }) => entry.name === tool.name);
      expect(tool.inputSchema).toEqual(twin.inputSchema);
    }
    const annotations = Object.fromEntries(tools.map((tool) => [tool.name, tool.annotations]));
    for (const name of ['send_email', 'schedule_campaign']) {
      expect(annotations[name]).toMatchObject({ destructiveHint: true, readOnlyHint: false });
    }
    for (const name of ['get_email', 'list_emails', 'get_subscriber', 'list_subscribers', 'list_campaigns', 'get_campaign', 'list_domains', 'get_domain']) {
      expect(annotations[name]).toMatchObject({ readOnlyHint: true, destructiveHint: false });
    }
    for (const name of ['create_subscriber', 'update_subscriber', 'unsubscribe_subscriber']) {
      expect(annotations[name]).toMatchObject({ readOnlyHint: false, destructiveHint: false });
    }
  });

  it('is 401 missing_api_key without a valid token', async () => {
    const initialize = {
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } },
    };
    for (const headers of [{}, bearer('svc_' + '1'.repeat(64))]) {
      const res = await fetch(`${baseUrl}/mcp`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
        body: JSON.stringify(initialize),
      });
      expect(res.status).toBe(401);
      expect(await res.json()).toMatchObject({ name: 'missing_api_key', statusCode: 401 });
    }
  });

  it('answers GET with 405 (stateless: no server stream)', async () => {
    const res = await fetch(`${baseUrl}/mcp`, { headers: { accept: 'text/event-stream', ...bearer(token) } });
    expect(res.status).toBe(405);
  });
});

describe('verify_email', () => {
  it('answers what POST /api/v2/verify answers and counts against the same monthly quota', async () => {
    const direct = await v2('POST', '/api/v2/verify', { email: 'jane@acme.io' });
    expect(direct.statusCode).toBe(200);
    expect(direct.json()).toMatchObject({ object: 'email_verification', result: 'risky', accept: true, score: 80 });
    const used = direct.json().quota.used;
    const res = await runBoth(ctx, clients, token, 'verify_email', { email: 'jane@acme.io' }, { ignore: ['id', 'quota'] });
    expect(res.statusCode).toBe(200);
    const body = res.body as { id: string; quota: { used: number }; cache_hit: boolean };
    const { id: _a, quota: _b, cache_hit: _c, ...rest } = direct.json();
    expect(body).toMatchObject({ ...rest, cache_hit: true });
    // The v2 call, then the HTTP tool call, then the MCP call: one quota.
    expect(body.quota.used).toBe(used + 1);
    const after = await v2('POST', '/api/v2/verify', { email: 'x@acme.io' });
    expect(after.json().quota.used).toBe(used + 3);
  });

  it('reports a rejection as 200 and a missing email as 422 naming it', async () => {
    const res = await runBoth(ctx, clients, token, 'verify_email', { email: 'not an address' }, { ignore: ['id', 'quota'] });
    expect(res.statusCode).toBe(200);
    expect(res.body).toMatchObject({ accept: false, issues: [{ code: 'invalid_format' }] });
    const missing = await runBoth(ctx, clients, token, 'verify_email', {});
    expect(missing.statusCode).toBe(422);
    expect(missing.body).toMatchObject({ name: 'validation_error', details: [{ path: 'arguments.email' }] });
  });

  it("answers the endpoint's 403 without the emails permission", async () => {
    const narrow = await mint(['subscribers'], 'no emails');
    const res = await runBoth(ctx, clients, narrow, 'verify_email', { email: 'jane@acme.io' });
    expect(res).toMatchObject({ statusCode: 403, body: { name: 'missing_permission' } });
    // Permission before the arguments, as on the endpoint: arguments that fail the schema too.
    const bad = await runBoth(ctx, clients, narrow, 'verify_email', {});
    expect(bad).toMatchObject({ statusCode: 403, body: { name: 'missing_permission' } });
    // The email reads answer their 403 named validation_error (docs/agents.md), bad arguments or not.
    const badId = await runBoth(ctx, clients, narrow, 'get_email', { id: 42 });
    expect(badId).toMatchObject({ statusCode: 403, body: { name: 'validation_error' } });
    const badList = await runBoth(ctx, clients, narrow, 'list_emails', { after: '' });
    expect(badList).toMatchObject({ statusCode: 403, body: { name: 'validation_error' } });
    // A body the route itself does not take (arguments not wrapped in `arguments`): the 403 still.
    const unwrapped = await ctx.app.inject({ method: 'POST', url: '/api/v2/tools/verify_email', headers: bearer(narrow), payload: { email: 'jane@acme.io' } });
    expect(unwrapped.statusCode).toBe(403);
    expect(unwrapped.json()).toMatchObject({ name: 'missing_permission' });
    // With the permission, the same body is the route's 422 naming the field.
    const allowed = await ctx.app.inject({ method: 'POST', url: '/api/v2/tools/verify_email', headers: bearer(token), payload: { email: 'jane@acme.io' } });
    expect(allowed.json()).toMatchObject({ statusCode: 422, details: [{ path: 'email' }] });
  });
});

describe('send_email, get_email, list_emails', () => {
  const message = { from: 'Acme <hello@acme.test>', to: 'jane@example.com', subject: 'Hello', markdown: '# Hi' };

  it('sends once per idempotency key, and the email is what v2 shows', async () => {
    const res = await runBoth(ctx, clients, token, 'send_email', { ...message, idempotency_key: 'tool-send-1' });
    expect(res.statusCode).toBe(200);
    const { id } = res.body as { id: string };
    expect(id).toMatch(/^eml_/);
    const direct = await v2('GET', `/api/v2/emails/${id}`);
    expect(direct.json()).toMatchObject({ id, subject: 'Hello', to: ['jane@example.com'], last_event: 'queued' });
    const got = await runBoth(ctx, clients, token, 'get_email', { id });
    expect(got).toEqual({ statusCode: 200, body: direct.json() });
    // HTTP and MCP sent with the same key: one email.
    const listed = await v2('GET', '/api/v2/emails');
    expect(listed.json().data.filter((row: { id: string }) => row.id === id)).toHaveLength(1);
  });

  it('takes the Idempotency-Key header of POST /api/v2/tools/send_email as the key when the arguments give none', async () => {
    const call = (headers: Record<string, string>, subject: string) =>
      ctx.app.inject({ method: 'POST', url: '/api/v2/tools/send_email', headers: { authorization: `Bearer ${token}`, ...headers }, payload: { arguments: { ...message, subject } } });
    const first = await call({ 'idempotency-key': 'tool-header-1' }, 'Header key');
    const again = await call({ 'idempotency-key': 'tool-header-1' }, 'Header key');
    expect(first.statusCode).toBe(200);
    expect(again.json().id).toBe(first.json().id);
    // The same key with another body: the endpoint's 409, as on POST /api/v2/emails.
    expect((await call({ 'idempotency-key': 'tool-header-1' }, 'Another body')).statusCode).toBe(409);
  });

  it('sends without a key, and refuses what the endpoint refuses', async () => {
    const res = await runOverHttp(ctx, token, 'send_email', message);
    expect(res.statusCode).toBe(200);
    const two = await runBoth(ctx, clients, token, 'send_email', { ...message, to: ['a@example.com', 'b@example.com'] });
    expect(two).toMatchObject({ statusCode: 422, body: { name: 'validation_error', details: [expect.objectContaining({ path: 'arguments.to' })] } });
    const none = await runBoth(ctx, clients, token, 'send_email', { from: message.from, to: message.to, subject: 'x' });
    expect(none).toMatchObject({ statusCode: 422, body: { name: 'validation_error' } });
  });

  it('lists like GET /api/v2/emails, with its cursors and errors', async () => {
    const direct = await v2('GET', '/api/v2/emails?limit=1');
    const res = await runBoth(ctx, clients, token, 'list_emails', { limit: 1 });
    expect(res).toEqual({ statusCode: 200, body: direct.json() });
    const first = direct.json().data[0].id;
    const older = await v2('GET', `/api/v2/emails?after=${first}`);
    expect(await runBoth(ctx, clients, token, 'list_emails', { after: first })).toEqual({ statusCode: 200, body: older.json() });
    const both = await runBoth(ctx, clients, token, 'list_emails', { after: first, before: first });
    expect(both).toMatchObject({ statusCode: 422, body: { name: 'validation_error' } });
  });

  it("answers 404 for another organization's email and 403 validation_error without emails", async () => {
    const { id } = (await runOverHttp(ctx, token, 'send_email', message)).body as { id: string };
    expect(await runBoth(ctx, clients, otherToken, 'get_email', { id })).toMatchObject({ statusCode: 404, body: { name: 'not_found' } });
    const narrow = await mint(['subscribers'], 'no emails either');
    expect(await runBoth(ctx, clients, narrow, 'list_emails', {})).toMatchObject({ statusCode: 403, body: { name: 'validation_error' } });
    expect(await runBoth(ctx, clients, narrow, 'send_email', message)).toMatchObject({ statusCode: 403, body: { name: 'missing_permission' } });
  });
});

describe('subscriber tools', () => {
  it('create_subscriber upserts like POST /api/v2/subscribers', async () => {
    const res = await runBoth(ctx, clients, token, 'create_subscriber', { email: 'Ann@Example.com', name: 'Ann', tags: ['vip'], fields: { plan: 'pro' } });
    expect(res.statusCode).toBe(200);
    expect(res.body).toMatchObject({ email: 'ann@example.com', name: 'Ann', status: 'SUBSCRIBED', tags: [{ name: 'vip' }], fields: { plan: 'pro' } });
    const bad = await runBoth(ctx, clients, token, 'create_subscriber', { email: 'nope' });
    expect(bad).toMatchObject({ statusCode: 422, body: { name: 'validation_error', details: [{ path: 'arguments.email' }] } });
  });

  it('get_subscriber answers GET /api/v2/subscribers/{s} by id or email', async () => {
    const direct = await v2('GET', '/api/v2/subscribers/ann%40example.com');
    expect(direct.statusCode).toBe(200);
    expect(await runBoth(ctx, clients, token, 'get_subscriber', { subscriber: 'ann@example.com' })).toEqual({ statusCode: 200, body: direct.json() });
    expect(await runBoth(ctx, clients, token, 'get_subscriber', { subscriber: direct.json().id })).toEqual({ statusCode: 200, body: direct.json() });
    expect(await runBoth(ctx, clients, otherToken, 'get_subscriber', { subscriber: 'ann@example.com' })).toMatchObject({ statusCode: 404 });
  });

  it('update_subscriber patches, and v2 sees it', async () => {
    const res = await runOverHttp(ctx, token, 'update_subscriber', { subscriber: 'ann@example.com', name: 'Ann B', fields: { plan: 'team' } });
    expect(res).toMatchObject({ statusCode: 200, body: { name: 'Ann B', fields: { plan: 'team' } } });
    const again = await runBoth(ctx, clients, token, 'update_subscriber', { subscriber: 'ann@example.com', name: 'Ann B', fields: { plan: 'team' } });
    expect(again).toEqual(res);
    const direct = await v2('GET', '/api/v2/subscribers/ann%40example.com');
    expect(direct.json()).toMatchObject({ name: 'Ann B', fields: [{ name: 'plan', value: 'team' }] });
    const missing = await runBoth(ctx, clients, token, 'update_subscriber', { subscriber: 'ghost@example.com', name: 'x' });
    expect(missing).toMatchObject({ statusCode: 404, body: { name: 'not_found' } });
  });

  it('unsubscribe_subscriber unsubscribes, and v2 sees it', async () => {
    const res = await runBoth(ctx, clients, token, 'unsubscribe_subscriber', { subscriber: 'ann@example.com' });
    expect(res).toMatchObject({ statusCode: 200, body: { email: 'ann@example.com', status: 'UNSUBSCRIBED' } });
    expect((await v2('GET', '/api/v2/subscribers/ann%40example.com')).json().status).toBe('UNSUBSCRIBED');
  });

  it('list_subscribers answers what GET /api/v2/subscribers answers, filters included', async () => {
    await v2('POST', '/api/v2/subscribers', { email: 'bob@example.com', tags: ['vip'] });
    for (const [args, query] of [
      [{}, ''],
      [{ limit: 1 }, '?limit=1'],
      [{ status: 'UNSUBSCRIBED' }, '?status=UNSUBSCRIBED'],
      [{ tag: 'vip' }, '?tag=vip'],
      [{ query: 'bob' }, '?query=bob'],
    ] as const) {
      const direct = await v2('GET', `/api/v2/subscribers${query}`);
      expect(direct.statusCode).toBe(200);
      expect(await runBoth(ctx, clients, token, 'list_subscribers', args)).toEqual({ statusCode: 200, body: direct.json() });
    }
    expect(await runBoth(ctx, clients, token, 'list_subscribers', { after: 'nope' })).toMatchObject({ statusCode: 422, body: { name: 'validation_error' } });
  });

  it("answers the endpoint's 403 without the subscribers permission", async () => {
    const narrow = await mint(['emails'], 'emails only');
    for (const [name, args] of [
      ['create_subscriber', { email: 'z@example.com' }],
      ['get_subscriber', { subscriber: 'ann@example.com' }],
      ['update_subscriber', { subscriber: 'ann@example.com', name: 'x' }],
      ['unsubscribe_subscriber', { subscriber: 'ann@example.com' }],
      ['list_subscribers', {}],
    ] as const) {
      expect(await runBoth(ctx, clients, narrow, name, args)).toMatchObject({ statusCode: 403, body: { name: 'missing_permission' } });
    }
  });
});

describe('campaign tools (list_campaigns, get_campaign, schedule_campaign)', () => {
  let senderId: string;

  beforeAll(async () => {
    await v2('POST', '/api/v2/subscribers', { email: 'reader@example.com' });
    const sender = await v2('POST', '/api/v2/senders', { name: 'Acme News', email: 'news@one.example' });
    expect(sender.statusCode).toBe(200);
    senderId = sender.json().id;
  });

  async function createCampaign(name: string): Promise<string> {
    const res = await v2('POST', '/api/v2/campaigns', {
      name,
      subject: 'News',
      content: 'Hello {{name}}. [Unsubscribe]({{unsubscribe_url}})',
      contentType: 'MARKDOWN',
      senderId,
    });
    expect(res.statusCode).toBe(200);
    return res.json().id;
  }

  it('list_campaigns and get_campaign answer what v2 answers', async () => {
    const id = await createCampaign('First');
    await createCampaign('Second');
    const list = await v2('GET', '/api/v2/campaigns?limit=1');
    expect(await runBoth(ctx, clients, token, 'list_campaigns', { limit: 1 })).toEqual({ statusCode: 200, body: list.json() });
    const drafts = await v2('GET', '/api/v2/campaigns?status=DRAFT');
    expect(await runBoth(ctx, clients, token, 'list_campaigns', { status: 'DRAFT' })).toEqual({ statusCode: 200, body: drafts.json() });
    const newer = await v2('GET', `/api/v2/campaigns?before=${id}`);
    expect(newer.json().data.map((c: { name: string }) => c.name)).toContain('Second');
    expect(await runBoth(ctx, clients, token, 'list_campaigns', { before: id })).toEqual({ statusCode: 200, body: newer.json() });
    const got = await v2('GET', `/api/v2/campaigns/${id}`);
    expect(await runBoth(ctx, clients, token, 'get_campaign', { campaignId: id })).toEqual({ statusCode: 200, body: got.json() });
    expect(await runBoth(ctx, clients, otherToken, 'get_campaign', { campaignId: id })).toMatchObject({ statusCode: 404, body: { name: 'not_found' } });
  });

  it('schedule_campaign schedules a draft over HTTP and over MCP, and refuses a non-draft with 400', async () => {
    const scheduledAt = new Date(Date.now() + 3_600_000).toISOString();
    const overHttp = await createCampaign('Over HTTP');
    const res = await runOverHttp(ctx, token, 'schedule_campaign', { campaignId: overHttp, scheduledAt });
    expect(res).toMatchObject({ statusCode: 200, body: { id: overHttp, status: 'SCHEDULED', recipientCount: expect.any(Number) } });
    const overMcp = await createCampaign('Over MCP');
    const mcp = await runOverMcp(clients, token, 'schedule_campaign', { campaignId: overMcp, scheduledAt });
    expect(mcp).toMatchObject({ isError: false, body: { id: overMcp, status: 'SCHEDULED' } });
    for (const id of [overHttp, overMcp]) expect((await v2('GET', `/api/v2/campaigns/${id}`)).json().status).toBe('SCHEDULED');
    const again = await runBoth(ctx, clients, token, 'schedule_campaign', { campaignId: overHttp });
    expect(again).toMatchObject({ statusCode: 400, body: { name: 'validation_error' } });
  });

  it('lets an MCP client list the tools, verify an address and schedule a campaign (the issue, end to end)', async () => {
    const client = await clients.for(token);
    const { tools } = await client.listTools();
    expect(tools.map((tool) => tool.name)).toEqual(expect.arrayContaining(['verify_email', 'schedule_campaign']));
    const verified = await client.callTool({ name: 'verify_email', arguments: { email: 'jane@acme.io' } });
    expect(verified.isError).toBeFalsy();
    expect(verified.structuredContent).toMatchObject({ object: 'email_verification', accept: true });
    const id = await createCampaign('End to end');
    const scheduled = await client.callTool({ name: 'schedule_campaign', arguments: { campaignId: id } });
    expect(scheduled.isError).toBeFalsy();
    expect(scheduled.structuredContent).toMatchObject({ id, status: 'SCHEDULED' });
    expect((await v2('GET', `/api/v2/campaigns/${id}`)).json().status).toBe('SCHEDULED');
  });

  it("answers the endpoint's 403 without the send permission", async () => {
    const marketing = await mint(['campaigns'], 'campaigns without send');
    const id = await createCampaign('Not sendable');
    expect(await runBoth(ctx, clients, marketing, 'schedule_campaign', { campaignId: id })).toMatchObject({
      statusCode: 403,
      body: { name: 'missing_permission' },
    });
    expect((await v2('GET', `/api/v2/campaigns/${id}`)).json().status).toBe('DRAFT');
  });
});

describe('rate limit of the outer layers', () => {
  it('counts one tool call or one v1 call as one request: the one its endpoint counts', async () => {
    const limited = await createTestContext({ RATE_LIMIT_PER_SECOND: '4' });
    try {
      const { token: own } = await createOrg(limited.services);
      const call = (i: number) =>
        i % 2 === 0
          ? limited.app.inject({ method: 'POST', url: '/api/v2/tools/list_domains', headers: bearer(own), payload: { arguments: {} } })
          : limited.app.inject({ method: 'GET', url: '/api/v1/tags', headers: bearer(own) });
      // Four calls, then two more, within one second; start just after a second begins, and
      // try again should the machine be slow enough to cross into the next one.
      for (let attempt = 0; attempt < 3; attempt += 1) {
        await new Promise((resolve) => setTimeout(resolve, 1000 - (Date.now() % 1000) + 5));
        const second = Math.floor(Date.now() / 1000);
        const answers = [];
        for (let i = 0; i < 6; i += 1) answers.push(await call(i));
        if (Math.floor(Date.now() / 1000) !== second) continue;
        expect(answers.map((res) => res.statusCode)).toEqual([200, 200, 200, 200, 429, 429]);
        const refused = answers[4]!;
        expect(refused.headers['retry-after']).toBeDefined();
        expect(refused.json()).toMatchObject({ name: 'rate_limit_exceeded' });
        return;
      }
      throw new Error('could not fit five calls in one second');
    } finally {
      await limited.close();
    }
  });
});

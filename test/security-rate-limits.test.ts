import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createToken } from '../src/shared/tokens/service.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

/**
 * Limits per organization (docs/security.md): more tokens do not buy more requests, every
 * interface counts (v2, tools, MCP, v1), and tokens and domains are capped.
 */
const ORG_LIMIT = 5;
let ctx: TestContext;
let organizationId: string;
let tokens: string[];

beforeAll(async () => {
  ctx = await createTestContext({
    RATE_LIMIT_PER_SECOND: '1000',
    RATE_LIMIT_ORG_PER_SECOND: String(ORG_LIMIT),
    MAX_TOKENS_PER_ORGANIZATION: '3',
    MAX_DOMAINS_PER_ORGANIZATION: '2',
    MAX_WEBHOOKS_PER_ORGANIZATION: '2',
    WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
  });
  const org = await createOrg(ctx.services);
  organizationId = org.organizationId;
  tokens = [org.token];
  const caller = { organizationId, tokenId: 'setup', permissions: ['*' as const] };
  for (const name of ['second', 'third']) tokens.push((await createToken(ctx.services.orm.em.fork(), ctx.services.box, caller, { name })).token);
});
afterAll(async () => ctx?.close());

/** Runs `burst` within one wall-clock second (retried when the machine is too slow), returning its status codes. */
async function withinOneSecond(burst: () => Promise<number[]>): Promise<number[]> {
  for (let attempt = 0; attempt < 4; attempt++) {
    await new Promise((resolve) => setTimeout(resolve, 1000 - (Date.now() % 1000) + 5));
    const second = Math.floor(Date.now() / 1000);
    const codes = await burst();
    if (Math.floor(Date.now() / 1000) === second) return codes;
  }
  throw new Error('could not fit the burst in one second');
}

describe('RATE_LIMIT_ORG_PER_SECOND', () => {
  it('N tokens of one organization share one budget', async () => {
    let refused: { headers: Record<string, unknown> } | undefined;
    const codes = await withinOneSecond(() =>
      Promise.all(tokens.flatMap((token) => Array.from({ length: 4 }, () => ctx.app.inject({ url: '/api/v2/tags', headers: bearer(token) })))).then((all) => {
        refused = all.find((r) => r.statusCode === 429);
        return all.map((r) => r.statusCode);
      }),
    );
    // The 429 names the organization's limit, the one that refused it.
    expect(refused?.headers).toMatchObject({ 'ratelimit-limit': String(ORG_LIMIT), 'ratelimit-remaining': '0', 'retry-after': expect.any(String) });
    expect(codes.filter((c) => c === 200)).toHaveLength(ORG_LIMIT);
    expect(codes.filter((c) => c === 429)).toHaveLength(12 - ORG_LIMIT);
  });

  it('counts tool and v1 calls (every dispatching layer: tools, MCP, v1), even those the layer refuses before dispatching', async () => {
    const codes = await withinOneSecond(async () => {
      const answers = [];
      // Refused by the tool layer (unknown tool, arguments not an object) or the v1 layer: nothing dispatched.
      for (let i = 0; i < ORG_LIMIT; i++) {
        answers.push(await ctx.app.inject({ method: 'POST', url: '/api/v2/tools/no_such_tool', headers: bearer(tokens[i % 3]!), payload: { arguments: {} } }));
      }
      answers.push(await ctx.app.inject({ url: '/api/v1/tags', headers: bearer(tokens[1]!) }));
      answers.push(await ctx.app.inject({ url: '/api/v2/tags', headers: bearer(tokens[2]!) }));
      return answers.map((r) => r.statusCode);
    });
    expect(codes.slice(0, ORG_LIMIT).every((c) => c !== 429)).toBe(true);
    expect(codes.slice(ORG_LIMIT)).toEqual([429, 429]);
  });

  it('counts every tool call of an MCP batch beyond the first, which its POST paid for', async () => {
    const call = (id: number) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'list_domains', arguments: {} } });
    const codes = await withinOneSecond(async () => {
      // One POST, ORG_LIMIT tool calls: the budget of the second.
      const batch = await ctx.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: { ...bearer(tokens[0]!), accept: 'application/json, text/event-stream' },
        payload: Array.from({ length: ORG_LIMIT }, (_, i) => call(i + 1)),
      });
      const next = await ctx.app.inject({ url: '/api/v2/tags', headers: bearer(tokens[1]!) });
      return [batch.statusCode, next.statusCode];
    });
    expect(codes).toEqual([200, 429]);
  });

  it('answers an MCP batch with the headers of its last call in the batch\'s order: the 429 of a call past the limit, with Retry-After', async () => {
    const call = (id: number) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'list_domains', arguments: {} } });
    let answer: Awaited<ReturnType<typeof ctx.app.inject>> | undefined;
    await withinOneSecond(async () => {
      answer = await ctx.app.inject({
        method: 'POST',
        url: '/mcp',
        headers: { ...bearer(tokens[0]!), accept: 'application/json, text/event-stream' },
        payload: Array.from({ length: ORG_LIMIT + 2 }, (_, i) => call(i + 1)),
      });
      return [answer.statusCode];
    });
    const answers = answer!.json() as { id: number; result: { isError?: boolean } }[];
    expect(answers.find((a) => a.id === ORG_LIMIT + 2)!.result.isError).toBe(true);
    expect(answer!.headers['ratelimit-remaining']).toBe('0');
    expect(answer!.headers['retry-after']).toMatch(/^\d+$/);
  });

  it('counts each request of a v1 page walk beyond the first, which the v1 request paid for', async () => {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    for (const email of ['walk1@example.com', 'walk2@example.com', 'walk3@example.com']) {
      const created = await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(tokens[0]!), payload: { email } });
      expect(created.statusCode).toBe(200);
    }
    const codes = await withinOneSecond(async () => {
      // Page 3 of 1: the two subscribers before it are skipped in one request, then the page
      // is a second: 2 units of the budget of 5.
      const walk = await ctx.app.inject({ url: '/api/v1/subscribers?page=3&limit=1', headers: bearer(tokens[1]!) });
      expect(walk.json()).toMatchObject({ success: true, pagination: { page: 3, limit: 1 } });
      const rest = [];
      for (let i = 0; i < 4; i++) rest.push(await ctx.app.inject({ url: '/api/v2/tags', headers: bearer(tokens[2]!) }));
      return [walk.statusCode, ...rest.map((r) => r.statusCode)];
    });
    expect(codes).toEqual([200, 200, 200, 200, 429]);
  });

  it('an organization over its budget does not slow another one', async () => {
    const other = await createOrg(ctx.services, { name: 'Other' });
    const codes = await withinOneSecond(async () => {
      const mine = await Promise.all(Array.from({ length: ORG_LIMIT + 2 }, () => ctx.app.inject({ url: '/api/v2/tags', headers: bearer(tokens[0]!) })));
      const theirs = await ctx.app.inject({ url: '/api/v2/tags', headers: bearer(other.token) });
      return [...mine.map((r) => r.statusCode), theirs.statusCode];
    });
    expect(codes.at(-1)).toBe(200);
    expect(codes.filter((c) => c === 429)).toHaveLength(2);
  });
});

describe('caps per organization', () => {
  it('MAX_TOKENS_PER_ORGANIZATION: a fourth token is refused and not created', async () => {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(tokens[0]!), payload: { name: 'fourth', reuseIfExists: false } });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error' });
    expect(res.json().message).toMatch(/MAX_TOKENS_PER_ORGANIZATION/);
    const [row] = await ctx.services.orm.em.fork().execute<{ n: string }[]>('select count(*) as n from api_tokens where organization_id = ?', [organizationId]);
    expect(Number(row!.n)).toBe(3);
  });

  it('MAX_DOMAINS_PER_ORGANIZATION: a third domain is refused before its key is made', async () => {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    for (const domain of ['one.example', 'two.example']) {
      expect((await ctx.app.inject({ method: 'POST', url: '/api/v2/domains', headers: bearer(tokens[0]!), payload: { domain } })).statusCode).toBe(200);
    }
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/domains', headers: bearer(tokens[0]!), payload: { domain: 'three.example' } });
    expect(res.statusCode).toBe(422);
    expect(res.json().message).toMatch(/MAX_DOMAINS_PER_ORGANIZATION/);
    const [row] = await ctx.services.orm.em.fork().execute<{ n: string }[]>('select count(*) as n from domains where organization_id = ?', [organizationId]);
    expect(Number(row!.n)).toBe(2);
  });
});

describe('MAX_WEBHOOKS_PER_ORGANIZATION', () => {
  it('refuses a third endpoint in the API and the dashboard alike, and counts per organization', async () => {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const create = (token: string, n: number) =>
      ctx.app.inject({ method: 'POST', url: '/api/v2/webhooks', headers: bearer(token), payload: { url: `http://127.0.0.1:9/hook-${n}`, events: ['email.sent'] } });
    // Two at once: the cap holds under concurrent creates.
    const first = await Promise.all([create(tokens[0]!, 1), create(tokens[1]!, 2), create(tokens[2]!, 3)]);
    expect(first.map((r) => r.statusCode).sort()).toEqual([200, 200, 422]);
    const refused = first.find((r) => r.statusCode === 422)!.json();
    expect(refused).toMatchObject({ name: 'validation_error' });
    expect(refused.message).toMatch(/MAX_WEBHOOKS_PER_ORGANIZATION/);
    const [row] = await ctx.services.orm.em.fork().execute<{ n: string }[]>('select count(*) as n from webhook_endpoints where organization_id = ?', [organizationId]);
    expect(Number(row!.n)).toBe(2);
    // Another organization has its own count.
    const other = await createOrg(ctx.services);
    expect((await create(other.token, 4)).statusCode).toBe(200);
  });
});

describe('RATE_LIMIT_PER_SECOND with RATE_LIMIT_ORG_PER_SECOND', () => {
  let small: TestContext;
  let runaway: string;
  let sibling: string;
  beforeAll(async () => {
    small = await createTestContext({ RATE_LIMIT_PER_SECOND: '2', RATE_LIMIT_ORG_PER_SECOND: String(ORG_LIMIT) });
    const org = await createOrg(small.services);
    runaway = org.token;
    const caller = { organizationId: org.organizationId, tokenId: 'setup', permissions: ['*' as const] };
    sibling = (await createToken(small.services.orm.em.fork(), small.services.box, caller, { name: 'sibling' })).token;
  });
  afterAll(async () => small?.close());

  it('a request refused by its token limit does not spend the organization budget (a throttled token does not lock out its siblings)', async () => {
    const codes = await withinOneSecond(async () => {
      const answers = [];
      for (let i = 0; i < 6; i++) answers.push(await small.app.inject({ url: '/api/v2/tags', headers: bearer(runaway) }));
      for (let i = 0; i < 2; i++) answers.push(await small.app.inject({ url: '/api/v2/tags', headers: bearer(sibling) }));
      return answers.map((r) => r.statusCode);
    });
    // The runaway token: 2, then its own limit. Its sibling: 2 of the organization's 5 left 3.
    expect(codes).toEqual([200, 200, 429, 429, 429, 429, 200, 200]);
  });

  it('so through the tool layer, whose endpoint counts the token: once its limit is known to refuse, the organization is not counted', async () => {
    const codes = await withinOneSecond(async () => {
      const answers = [];
      const tool = (token: string) => small.app.inject({ method: 'POST', url: '/api/v2/tools/list_domains', headers: bearer(token), payload: { arguments: {} } });
      for (let i = 0; i < 8; i++) answers.push(await tool(runaway));
      for (let i = 0; i < 2; i++) answers.push(await tool(sibling));
      return answers.map((r) => r.statusCode);
    });
    // The third call is refused by the endpoint (the organization counted it); the rest by the layer, uncounted.
    expect(codes).toEqual([200, 200, 429, 429, 429, 429, 429, 429, 200, 200]);
  });
});

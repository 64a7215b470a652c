import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/api/app.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

function post(body: unknown, as = token) {
  return ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(as), payload: body as object });
}

describe('POST /api/v2/tokens (docs/foundation.md "Tokens and permissions")', () => {
  it('mints a token with a preset and shows the secret once', async () => {
    const res = await post({ name: 'app token', preset: 'app' });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toMatchObject({ name: 'app token', permissions: ['audience', 'emails', 'subscribers'], reused: false });
    expect(body.id).toMatch(/^tok_[0-9a-z]{26}$/);
    expect(body.token).toMatch(/^svc_[0-9a-f]{64}$/);
    expect(body.createdAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  });

  it('expands every preset of docs/foundation.md "Tokens and permissions"', async () => {
    const expected: Record<string, string[]> = {
      app: ['audience', 'emails', 'subscribers'],
      marketing: ['analytics', 'audience', 'campaigns', 'emails', 'subscribers', 'workflows'],
      sender: ['analytics', 'audience', 'campaigns', 'emails', 'send', 'subscribers', 'workflows'],
      full: ['*'],
    };
    for (const [preset, permissions] of Object.entries(expected)) {
      const res = await post({ name: `preset ${preset}`, preset });
      expect(res.json().permissions).toEqual(permissions);
    }
  });

  it('takes explicit permissions', async () => {
    const res = await post({ name: 'domains only', permissions: ['domains', 'tokens'] });
    expect(res.statusCode).toBe(200);
    expect(res.json().permissions).toEqual(['domains', 'tokens']);
  });

  it('gives the caller its own permissions when neither preset nor permissions is set', async () => {
    const limited = (await post({ name: 'limited', permissions: ['tokens', 'emails'] })).json().token;
    const res = await post({ name: 'child' }, limited);
    expect(res.statusCode).toBe(200);
    expect(res.json().permissions).toEqual(['emails', 'tokens']);
  });

  it('refuses both preset and permissions with 422', async () => {
    const res = await post({ name: 'both', preset: 'app', permissions: ['emails'] });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(res.json().details).toEqual([{ path: 'preset', message: expect.any(String) }]);
  });

  it.each([
    ['missing name', {}],
    ['empty name', { name: '' }],
    ['blank name', { name: '   ' }],
    ['name over 100 characters', { name: 'x'.repeat(101) }],
    ['unknown scope', { name: 'x', permissions: ['root'] }],
    ['unknown preset', { name: 'x', preset: 'admin' }],
    ['name of the wrong type', { name: 5 }],
  ])('refuses %s with 422', async (_label, body) => {
    const res = await post(body);
    expect(res.statusCode).toBe(422);
    expect(res.json().name).toBe('validation_error');
  });

  it('accepts a name of exactly 100 characters', async () => {
    expect((await post({ name: 'n'.repeat(100) })).statusCode).toBe(200);
  });

  it('returns the existing token with its secret and reused: true', async () => {
    const first = (await post({ name: 'ci', preset: 'app' })).json();
    const again = await post({ name: 'ci', preset: 'app' });
    expect(again.json()).toMatchObject({ id: first.id, token: first.token, reused: true });
  });

  it('mints a second token of the same name with reuseIfExists: false', async () => {
    const first = (await post({ name: 'deploy', preset: 'app' })).json();
    const second = (await post({ name: 'deploy', preset: 'app', reuseIfExists: false })).json();
    expect(second.id).not.toBe(first.id);
    expect(second.token).not.toBe(first.token);
    expect(second.reused).toBe(false);
  });

  it('agrees on one token when the same name is requested concurrently', async () => {
    const results = await Promise.all(Array.from({ length: 10 }, () => post({ name: 'race', preset: 'app' })));
    const ids = new Set(results.map((r) => r.json().id));
    expect(ids.size).toBe(1);
    expect(results.filter((r) => r.json().reused === false)).toHaveLength(1);
  });

  it('refuses to mint scopes the caller lacks with 403 missing_permission', async () => {
    const limited = (await post({ name: 'tokens+emails', permissions: ['tokens', 'emails'] })).json().token;
    for (const body of [{ name: 'a', preset: 'full' }, { name: 'b', permissions: ['domains'] }, { name: 'c', preset: 'sender' }]) {
      const res = await post(body, limited);
      expect(res.statusCode).toBe(403);
      expect(res.json()).toMatchObject({ name: 'missing_permission', statusCode: 403 });
    }
  });

  it('does not hand out a stronger existing token by name', async () => {
    await post({ name: 'strong', preset: 'full' });
    const limited = (await post({ name: 'weak', permissions: ['tokens'] })).json().token;
    const res = await post({ name: 'strong' }, limited);
    expect(res.statusCode).toBe(403);
  });

  it('needs the tokens permission', async () => {
    const app = (await post({ name: 'app only', preset: 'app' })).json().token;
    const res = await post({ name: 'x' }, app);
    expect(res.statusCode).toBe(403);
    expect(res.json().name).toBe('missing_permission');
  });
});

describe('GET /api/v2/tokens (docs/foundation.md "Tokens and permissions")', () => {
  it('lists summaries with last4 and never the secret', async () => {
    const created = (await post({ name: 'listed', preset: 'app' })).json();
    const res = await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(token) });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.object).toBe('list');
    expect(body.has_more).toBe(false);
    const item = body.data.find((t: { id: string }) => t.id === created.id);
    expect(item).toEqual({ id: created.id, name: 'listed', last4: created.token.slice(-4), permissions: created.permissions, createdAt: created.createdAt });
    expect(res.body).not.toContain(created.token);
  });

  it('truncates with limit and sets has_more', async () => {
    const res = await ctx.app.inject({ url: '/api/v2/tokens?limit=1', headers: bearer(token) });
    expect(res.json().data).toHaveLength(1);
    expect(res.json().has_more).toBe(true);
    const all = (await ctx.app.inject({ url: '/api/v2/tokens?limit=100', headers: bearer(token) })).json();
    expect(all.has_more).toBe(false);
  });

  it.each(['0', '101', 'abc', '1.5'])('refuses limit=%s with 422', async (limit) => {
    const res = await ctx.app.inject({ url: `/api/v2/tokens?limit=${limit}`, headers: bearer(token) });
    expect(res.statusCode).toBe(422);
    expect(res.json().details[0].path).toBe('limit');
  });

  it('never shows another organization its tokens', async () => {
    const other = await createOrg(ctx.services, { name: 'Other' });
    const mine = (await ctx.app.inject({ url: '/api/v2/tokens?limit=100', headers: bearer(token) })).json();
    const theirs = (await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(other.token) })).json();
    expect(theirs.data).toHaveLength(1);
    const myIds = new Set(mine.data.map((t: { id: string }) => t.id));
    expect(theirs.data.every((t: { id: string }) => !myIds.has(t.id))).toBe(true);
  });

  it('shows a token created through another API process at once, though listings are cached', async () => {
    const other = await buildApp(ctx.services);
    try {
      const list = async (app: typeof other) =>
        ((await app.inject({ url: '/api/v2/tokens?limit=100', headers: bearer(token) })).json().data as { id: string }[]).map((t) => t.id);
      await new Promise((resolve) => setTimeout(resolve, 300)); // its change subscription is up
      const before = await list(other);
      expect(await list(other)).toEqual(before); // served from its cache from now on
      const created = (await post({ name: 'made elsewhere', preset: 'app' })).json();
      const deadline = Date.now() + 1_000; // the cache's own expiry is 5 s: this is the announcement
      let after = await list(other);
      while (!after.includes(created.id) && Date.now() < deadline) after = await list(other);
      expect(after).toEqual([created.id, ...before]);
    } finally {
      await other.close();
    }
  });
});

describe('authentication (docs/foundation.md "Authentication and rate limiting")', () => {
  it.each([
    ['no header', {}],
    ['a non-bearer scheme', { authorization: `Basic ${Buffer.from('a:b').toString('base64')}` }],
    ['a malformed token', { authorization: 'Bearer nope' }],
    ['an unknown token', { authorization: `Bearer svc_${'0'.repeat(64)}` }],
  ])('answers 401 missing_api_key with %s', async (_label, headers) => {
    const res = await ctx.app.inject({ url: '/api/v2/tokens', headers });
    expect(res.statusCode).toBe(401);
    expect(res.json()).toEqual({ name: 'missing_api_key', message: expect.any(String), statusCode: 401 });
  });

  it('checks the token before validating the body', async () => {
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', payload: {} });
    expect(res.statusCode).toBe(401);
  });
});

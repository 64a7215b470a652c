import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TokenCache } from '../src/api/plugins/auth.js';
import { createTestContext, type TestContext } from './helpers/context.js';

let ctx: TestContext;
const caches: TokenCache[] = [];
beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => {
  for (const cache of caches) cache.close();
  await ctx?.close();
});

/** A cache subscribed to the token-change channel: it is used only then. */
async function startedCache(): Promise<TokenCache> {
  const cache = new TokenCache();
  caches.push(cache);
  cache.start(ctx.services);
  for (const started = Date.now(); !cache.active; ) {
    if (Date.now() - started > 10_000) throw new Error('the token cache did not subscribe');
    await new Promise((r) => setTimeout(r, 10));
  }
  return cache;
}

const randomSecret = () => `svc_${randomBytes(32).toString('hex')}`;

describe('token cache (docs/security.md)', () => {
  it('a flood of unknown secrets does not evict valid tokens', async () => {
    const cache = await startedCache();
    const now = Date.now();
    const valid = randomSecret();
    const caller = { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*' as const] };
    cache.set(valid, caller, now);
    // More unknown secrets than the cache holds.
    for (let i = 0; i < 10_001; i++) cache.set(randomSecret(), null, now);
    expect(cache.get(valid, now + 1)?.caller).toEqual(caller);
  });

  it('remembers an unknown secret briefly, a valid one longer', async () => {
    const cache = await startedCache();
    const now = Date.now();
    const unknown = randomSecret();
    const valid = randomSecret();
    cache.set(unknown, null, now);
    cache.set(valid, { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*'] }, now);
    expect(cache.get(unknown, now + 1_000)).toMatchObject({ caller: null });
    expect(cache.get(unknown, now + 2_500)).toBeUndefined();
    expect(cache.get(valid, now + 20_000)).toBeDefined();
    expect(cache.get(valid, now + 31_000)).toBeUndefined();
  });

  it('is not used while it is not subscribed to token changes (a revocation could be missed)', () => {
    const cache = new TokenCache();
    const secret = randomSecret();
    cache.set(secret, { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*'] }, Date.now());
    expect(cache.get(secret, Date.now())).toBeUndefined();
  });

  it("forgets an organization's tokens when a change is announced", async () => {
    const cache = await startedCache();
    const now = Date.now();
    const secret = randomSecret();
    cache.set(secret, { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*'] }, now);
    await ctx.services.redis.publish(`${ctx.env.config.redisPrefix}:tokens-changed`, 'org_1');
    for (const started = Date.now(); cache.get(secret, now) !== undefined; ) {
      if (Date.now() - started > 2_000) throw new Error('the announcement did not reach the cache within 2 s');
      await new Promise((r) => setTimeout(r, 10));
    }
  });
});

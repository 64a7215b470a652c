import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TokenCache } from '../src/shared/tokens/token-cache.js';
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
async function startedCache(clock = { now: () => performance.now() }): Promise<TokenCache> {
  const cache = new TokenCache({ perf: clock });
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
    const valid = randomSecret();
    const caller = { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*' as const] };
    cache.set(valid, caller);
    // More unknown secrets than the cache holds.
    for (let i = 0; i < 10_001; i++) cache.set(randomSecret(), null);
    expect(cache.get(valid)?.caller).toEqual(caller);
  });

  it('remembers an unknown secret briefly, a valid one longer', async () => {
    let now = 1_000_000;
    const cache = await startedCache({ now: () => now });
    const unknown = randomSecret();
    const valid = randomSecret();
    cache.set(unknown, null);
    cache.set(valid, { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*'] });
    const at = (ms: number) => {
      now = 1_000_000 + ms;
      // lru-cache reads its clock at most once a millisecond.
      return new Promise((resolve) => setTimeout(resolve, 5));
    };
    await at(1_000);
    expect(cache.get(unknown)).toMatchObject({ caller: null });
    await at(2_500);
    expect(cache.get(unknown)).toBeUndefined();
    await at(20_000);
    expect(cache.get(valid)).toBeDefined();
    await at(31_000);
    expect(cache.get(valid)).toBeUndefined();
  });

  it('is not used while it is not subscribed to token changes (a revocation could be missed)', () => {
    const cache = new TokenCache();
    const secret = randomSecret();
    cache.set(secret, { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*'] });
    expect(cache.get(secret)).toBeUndefined();
  });

  it("forgets an organization's tokens when a change is announced", async () => {
    const cache = await startedCache();
    const secret = randomSecret();
    cache.set(secret, { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*'] });
    await ctx.services.redis.publish(`${ctx.env.config.redisPrefix}:tokens-changed`, 'org_1');
    for (const started = Date.now(); cache.get(secret) !== undefined; ) {
      if (Date.now() - started > 2_000) throw new Error('the announcement did not reach the cache within 2 s');
      await new Promise((r) => setTimeout(r, 10));
    }
  });
});

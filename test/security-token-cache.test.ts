import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { TokenCache } from '../src/api/plugins/auth.js';

const randomSecret = () => `svc_${randomBytes(32).toString('hex')}`;

describe('token cache (docs/security.md)', () => {
  it('a flood of unknown secrets does not evict valid tokens', () => {
    const cache = new TokenCache();
    const now = Date.now();
    const valid = randomSecret();
    const caller = { organizationId: 'org_1', tokenId: 'tok_1', permissions: ['*' as const] };
    cache.set(valid, caller, now);
    // More unknown secrets than the cache holds.
    for (let i = 0; i < 10_001; i++) cache.set(randomSecret(), null, now);
    expect(cache.get(valid, now + 1)?.caller).toEqual(caller);
  });

  it('remembers an unknown secret briefly, a valid one longer', () => {
    const cache = new TokenCache();
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
});

import { describe, expect, it } from 'vitest';
import { randomHex } from '../src/shared/crypto.js';
import { isId, newId } from '../src/shared/ids.js';

// Ids are drawn from a pool of random bytes (src/shared/ids.ts): they must stay unique, valid,
// sortable by creation and evenly spread over the alphabet across many refills of the pool.
describe('ids', () => {
  it('are unique, valid and ordered by creation across refills of the random pool', () => {
    const ids = Array.from({ length: 20_000 }, () => newId('eml'));
    expect(new Set(ids).size).toBe(ids.length);
    expect(ids.every((id) => isId(id, 'eml'))).toBe(true);
    expect([...ids].sort()).toEqual(ids);
  });

  it('spread their random part evenly over the 32 characters', async () => {
    const counts = new Map<string, number>();
    // One id a millisecond: each draws a fresh random part (within a millisecond the monotonic
    // factory increments the last one instead).
    for (let i = 0; i < 40; i++) {
      const random = newId('eml').slice(4 + 10);
      for (const c of random) counts.set(c, (counts.get(c) ?? 0) + 1);
      await new Promise((r) => setTimeout(r, 1));
    }
    // 40 ids x 16 characters = 640 draws, 20 expected per character.
    expect(counts.size).toBe(32);
    for (const n of counts.values()) expect(n).toBeLessThan(60);
  });

  it('never give the same random bytes twice, across many refills of the pool', () => {
    // 4 KiB draws: each takes a pool of its own.
    const pools = [randomHex(4096), randomHex(4096), randomHex(4096)];
    expect(new Set(pools).size).toBe(3);
    // 8-byte draws (MIME boundaries) over six refills, some straddling a refill.
    const small = Array.from({ length: 3_000 }, () => randomHex(8));
    expect(new Set(small).size).toBe(small.length);
    expect(small.every((h) => /^[0-9a-f]{16}$/.test(h))).toBe(true);
  });
});

import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/api/app.js';
import { tokenRateLimiter } from '../src/shared/rate-limits/window.js';
import type { App } from '../src/api/types.js';
import { closeServices, createServices, type Services } from '../src/shared/container.js';
import { createLogger } from '../src/shared/logger.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

const LIMIT = 5;

let ctx: TestContext;
// A second API process on the same Redis (its own connections and token cache).
let otherServices: Services;
let other: App;
let tokenA: string;
let tokenB: string;

beforeAll(async () => {
  ctx = await createTestContext({ RATE_LIMIT_PER_SECOND: String(LIMIT) });
  otherServices = await createServices(ctx.env.config, createLogger({ level: 'silent' }));
  other = await buildApp(otherServices);
  await other.ready();
  ({ token: tokenA } = await createOrg(ctx.services));
  ({ token: tokenB } = await createOrg(ctx.services, { name: 'Other' }));
});
afterAll(async () => {
  await other?.close();
  if (otherServices) await closeServices(otherServices);
  await ctx?.close();
});

function get(app: App, token: string) {
  return app.inject({ url: '/api/v2/tokens?limit=1', headers: bearer(token) });
}

/**
 * The window is the wall-clock second (docs/foundation.md "Authentication and rate limiting": N
 * requests a second), so each case starts just after a second begins and has the rest of it for a
 * handful of requests. Tokens are looked up (and cached) first, in the previous second.
 */
async function atStartOfSecond(...warm: Array<[App, string]>): Promise<void> {
  for (const [app, token] of warm) await get(app, token);
  await sleep(1000 - (Date.now() % 1000) + 5);
}

describe('rate limiting (docs/foundation.md "Authentication and rate limiting": per token, in Redis)', () => {
  it(`answers 429 rate_limit_exceeded with Retry-After past ${LIMIT} requests a second`, async () => {
    await atStartOfSecond([ctx.app, tokenA]);
    for (let i = 1; i <= LIMIT; i++) {
      const res = await get(ctx.app, tokenA);
      expect(res.statusCode).toBe(200);
      expect(res.headers['ratelimit-limit']).toBe(String(LIMIT));
      expect(res.headers['ratelimit-remaining']).toBe(String(LIMIT - i));
      expect(res.headers['ratelimit-reset']).toBe('1');
      expect(res.headers['retry-after']).toBeUndefined();
    }
    const limited = await get(ctx.app, tokenA);
    expect(limited.statusCode).toBe(429);
    expect(limited.json()).toEqual({ name: 'rate_limit_exceeded', message: expect.any(String), statusCode: 429 });
    expect(limited.headers['retry-after']).toBe('1');
    expect(limited.headers['ratelimit-limit']).toBe(String(LIMIT));
    expect(limited.headers['ratelimit-remaining']).toBe('0');
    expect(limited.headers['ratelimit-reset']).toBe('1');

    // Waiting as told is enough.
    await sleep(Number(limited.headers['retry-after']) * 1000);
    expect((await get(ctx.app, tokenA)).statusCode).toBe(200);
  });

  it('counts per token: another token is unaffected', async () => {
    await atStartOfSecond([ctx.app, tokenA], [ctx.app, tokenB]);
    for (let i = 0; i < LIMIT; i++) await get(ctx.app, tokenA);
    expect((await get(ctx.app, tokenA)).statusCode).toBe(429);
    const res = await get(ctx.app, tokenB);
    expect(res.statusCode).toBe(200);
    expect(res.headers['ratelimit-remaining']).toBe(String(LIMIT - 1));
  });

  it('counts across API processes sharing one Redis', async () => {
    await atStartOfSecond([ctx.app, tokenB], [other, tokenB]);
    const statuses: number[] = [];
    for (let i = 0; i < LIMIT; i++) statuses.push((await get(i % 2 === 0 ? ctx.app : other, tokenB)).statusCode);
    expect(statuses).toEqual(Array(LIMIT).fill(200));
    expect((await get(other, tokenB)).statusCode).toBe(429);
    expect((await get(ctx.app, tokenB)).statusCode).toBe(429);
  });

  it('answers an unknown token 401, never 429', async () => {
    const unknown = `svc_${'a'.repeat(64)}`;
    for (let i = 0; i < LIMIT + 2; i++) expect((await get(ctx.app, unknown)).statusCode).toBe(401);
  });
});

describe('the per-token limiter (reservations of the window)', () => {
  // A fixed instant, so a case never straddles two windows.
  const now = (Math.floor(Date.now() / 1000) + 1) * 1000 + 100;
  const withLimit = (limit: number, services: Services = ctx.services) =>
    tokenRateLimiter({ ...services, config: { ...services.config, rateLimitPerSecond: limit } });
  const tokenId = () => `tok_${Math.random().toString(36).slice(2)}`;

  it('allows exactly the limit in one process, even for concurrent requests', async () => {
    const limiter = withLimit(50);
    const id = tokenId();
    const decisions = await Promise.all(Array.from({ length: 70 }, () => limiter.take(id, now)));
    const allowed = decisions.filter((d) => d.allowed);
    expect(allowed).toHaveLength(50);
    expect(new Set(allowed.map((d) => d.remaining)).size).toBeGreaterThan(1);
    expect(Math.min(...allowed.map((d) => d.remaining))).toBe(0);
    expect(decisions.filter((d) => !d.allowed).every((d) => d.remaining === 0)).toBe(true);
    // The next second is a new window.
    expect((await limiter.take(id, now + 1000)).allowed).toBe(true);
  });

  it('never allows more than the limit across processes, and refuses at most a little early', async () => {
    const a = withLimit(50);
    const b = withLimit(50, otherServices);
    const id = tokenId();
    const decisions = await Promise.all(Array.from({ length: 80 }, (_, i) => (i % 2 ? a : b).take(id, now)));
    const allowed = decisions.filter((d) => d.allowed).length;
    expect(allowed).toBeLessThanOrEqual(50);
    expect(allowed).toBeGreaterThanOrEqual(40);
  });

  it('counts a small limit request by request', async () => {
    const a = withLimit(3);
    const b = withLimit(3, otherServices);
    const id = tokenId();
    const seen = [];
    for (const limiter of [a, b, a, b]) seen.push(await limiter.take(id, now));
    expect(seen.map((d) => [d.allowed, d.remaining])).toEqual([[true, 2], [true, 1], [true, 0], [false, 0]]);
  });
});

import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closeServices, createServices } from '../src/shared/container.js';
import { createDns, toResolverServer, type CachedDns } from '../src/shared/dns/resolver.js';
import { createLogger } from '../src/shared/logger.js';
import { createRedis } from '../src/shared/redis.js';
import { createTestEnv, type TestEnv } from './helpers/context.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';

let env: TestEnv;
let server: TestDnsServer;
let redis: Redis;
let dns: CachedDns;

const LONG_TXT = `v=DKIM1; k=rsa; p=${'A'.repeat(400)}`;

beforeAll(async () => {
  server = await startDnsServer({
    'example.test': {
      a: ['192.0.2.1', '192.0.2.2'],
      aaaa: ['2001:db8::1'],
      mx: [
        { priority: 20, exchange: 'mx2.example.test' },
        { priority: 10, exchange: 'mx1.example.test' },
      ],
      txt: ['v=spf1 -all', LONG_TXT],
      ttl: 120,
    },
    'short.test': { a: ['192.0.2.3'], ttl: 5 },
    'long.test': { a: ['192.0.2.4'], ttl: 10_000_000 },
    'nullmx.test': { mx: [{ priority: 0, exchange: '' }] },
    'a-only.test': { a: ['192.0.2.5'] },
    'broken.test': { servfail: true },
    'silent.test': { drop: true },
  });
  env = await createTestEnv({ DNS_SERVERS: server.address });
  redis = createRedis(env.config.redisUrl, 'worker');
  dns = await createDns(redis, env.config, { timeoutMs: 300, tries: 1, cache: { floor: 30, ceiling: 3600, defaultTtl: 300, negativeTtl: 60 } });
});

afterAll(async () => {
  redis?.disconnect();
  await server?.close();
  await env?.dispose();
});

async function pttl(type: string, name: string): Promise<number> {
  return redis.pttl(`${env.config.redisPrefix}:dns:${type}:${name}`);
}

describe('shared DNS (DNS_SERVERS, README.md "Configuration")', () => {
  it('answers A and AAAA with the record TTL, then from the cache', async () => {
    const first = await dns.a('example.test');
    expect(first).toEqual({ kind: 'answer', records: ['192.0.2.1', '192.0.2.2'], ttl: 120, cacheHit: false });
    const again = await dns.a('EXAMPLE.test.');
    expect(again).toMatchObject({ kind: 'answer', records: ['192.0.2.1', '192.0.2.2'], cacheHit: true });
    expect(server.count('example.test', 'A')).toBe(1);
    expect(await pttl('a', 'example.test')).toBeGreaterThan(118_000);
    expect(await dns.aaaa('example.test')).toMatchObject({ kind: 'answer', records: ['2001:db8::1'], cacheHit: false });
  });

  it('sorts MX by priority and reports a null MX as exchange ""', async () => {
    expect(await dns.mx('example.test')).toMatchObject({
      kind: 'answer',
      records: [
        { priority: 10, exchange: 'mx1.example.test' },
        { priority: 20, exchange: 'mx2.example.test' },
      ],
      ttl: 300,
    });
    expect(await dns.mx('nullmx.test')).toMatchObject({ kind: 'answer', records: [{ priority: 0, exchange: '' }] });
  });

  it('joins the character-strings of a long TXT record (answer over TCP when truncated)', async () => {
    const txt = await dns.txt('example.test');
    expect(txt.kind).toBe('answer');
    if (txt.kind === 'answer') expect(txt.records.sort()).toEqual([LONG_TXT, 'v=spf1 -all'].sort());
  });

  it('clamps TTLs to the floor and the ceiling', async () => {
    expect(await dns.a('short.test')).toMatchObject({ ttl: 30 });
    expect(await dns.a('long.test')).toMatchObject({ ttl: 3600 });
    const short = await pttl('a', 'short.test');
    expect(short).toBeGreaterThan(28_000);
    expect(short).toBeLessThanOrEqual(30_000);
  });

  it('expires an entry when its TTL runs out', async () => {
    const quick = await createDns(redis, env.config, { cache: { floor: 1, ceiling: 1 } });
    server.set('expiring.test', { a: ['192.0.2.9'], ttl: 1 });
    expect(await quick.a('expiring.test')).toMatchObject({ cacheHit: false });
    expect(await quick.a('expiring.test')).toMatchObject({ cacheHit: true });
    server.set('expiring.test', { a: ['192.0.2.10'], ttl: 1 });
    await new Promise((r) => setTimeout(r, 1_100));
    expect(await quick.a('expiring.test')).toMatchObject({ records: ['192.0.2.10'], cacheHit: false });
    expect(server.count('expiring.test', 'A')).toBe(2);
  });

  it('caches NXDOMAIN and NODATA for the shorter negative TTL', async () => {
    expect(await dns.mx('missing.test')).toEqual({ kind: 'nxdomain', cacheHit: false });
    expect(await dns.mx('missing.test')).toEqual({ kind: 'nxdomain', cacheHit: true });
    expect(server.count('missing.test')).toBe(1);
    const negative = await pttl('mx', 'missing.test');
    expect(negative).toBeGreaterThan(58_000);
    expect(negative).toBeLessThanOrEqual(60_000);

    expect(await dns.mx('a-only.test')).toEqual({ kind: 'nodata', cacheHit: false });
    expect(await dns.mx('a-only.test')).toEqual({ kind: 'nodata', cacheHit: true });
    expect(server.count('a-only.test', 'MX')).toBe(1);
  });

  it('never caches SERVFAIL', async () => {
    const first = await dns.mx('broken.test');
    expect(first).toEqual({ kind: 'temporary', reason: 'ESERVFAIL' });
    const before = server.count('broken.test');
    expect(await dns.mx('broken.test')).toMatchObject({ kind: 'temporary' });
    expect(server.count('broken.test')).toBeGreaterThan(before);
    expect(await pttl('mx', 'broken.test')).toBe(-2);
  });

  it('never caches a timeout', async () => {
    const started = Date.now();
    expect(await dns.a('silent.test')).toEqual({ kind: 'temporary', reason: 'ETIMEOUT' });
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(await pttl('a', 'silent.test')).toBe(-2);
    server.set('silent.test', { a: ['192.0.2.7'] });
    expect(await dns.a('silent.test')).toMatchObject({ kind: 'answer', records: ['192.0.2.7'], cacheHit: false });
  });

  it('fresh lookups bypass the cache and refresh it', async () => {
    server.set('changing.test', { txt: ['old'] });
    expect(await dns.txt('changing.test')).toMatchObject({ records: ['old'], cacheHit: false });
    server.set('changing.test', { txt: ['new'] });
    expect(await dns.txt('changing.test')).toMatchObject({ records: ['old'], cacheHit: true });
    expect(await dns.fresh.txt('changing.test')).toMatchObject({ records: ['new'], cacheHit: false });
    expect(await dns.txt('changing.test')).toMatchObject({ records: ['new'], cacheHit: true });
  });

  it('sends one query for identical concurrent misses', async () => {
    server.set('popular.test', { a: ['192.0.2.8'] });
    const results = await Promise.all(Array.from({ length: 20 }, () => dns.a('popular.test')));
    expect(results.every((r) => r.kind === 'answer')).toBe(true);
    expect(server.count('popular.test', 'A')).toBe(1);
  });

  it('shares answers between processes through Redis', async () => {
    server.set('shared.test', { mx: [{ priority: 5, exchange: 'mx.shared.test' }] });
    expect(await dns.mx('shared.test')).toMatchObject({ cacheHit: false });
    const otherProcess = await createDns(redis, env.config);
    expect(await otherProcess.mx('shared.test')).toMatchObject({ kind: 'answer', records: [{ priority: 5, exchange: 'mx.shared.test' }], cacheHit: true });
    expect(server.count('shared.test', 'MX')).toBe(1);
  });

  it('takes DNS_SERVERS through createServices', async () => {
    const services = await createServices(env.config, createLogger({ level: 'silent' }));
    try {
      server.set('wired.test', { a: ['192.0.2.11'] });
      expect(await services.dns.a('wired.test')).toMatchObject({ kind: 'answer', records: ['192.0.2.11'] });
    } finally {
      await closeServices(services);
    }
  });

  it('accepts host, host:port and bracketed IPv6 servers', async () => {
    expect(await toResolverServer('127.0.0.1')).toBe('127.0.0.1');
    expect(await toResolverServer('127.0.0.1:5353')).toBe('127.0.0.1:5353');
    expect(await toResolverServer('[::1]:5353')).toBe('[::1]:5353');
    expect(await toResolverServer('::1')).toBe('::1');
    expect(await toResolverServer('localhost:53')).toMatch(/^(127\.0\.0\.1|\[::1\]):53$/);
  });
});

/**
 * npm run bench:dns — 10,000 lookups through the service's DNS (services.dns) against a
 * local DNS server started here: cold (every answer from the server, then stored in Redis)
 * then warm (every answer from the cache: the in-process layer), then as another process
 * would see it (in-process layer empty, answers from Redis). Prints lookups/s and ratios.
 */
import { randomBytes } from 'node:crypto';
import { createDns } from '../src/shared/dns/resolver.js';
import { createRedis, waitForRedis } from '../src/shared/redis.js';
import { startDnsServer } from '../test/helpers/dns-server.js';

const LOOKUPS = Number(process.env.BENCH_LOOKUPS ?? 10_000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 64);

async function main(): Promise<void> {
  const server = await startDnsServer();
  const names = Array.from({ length: LOOKUPS }, (_, i) => `host-${i}.bench.test`);
  for (const [i, name] of names.entries()) server.set(name, { a: [`10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`], ttl: 3600 });

  const redisUrl = process.env.REDIS_URL || 'redis://127.0.0.1:6379';
  const redisPrefix = `mrbench-${randomBytes(4).toString('hex')}`;
  const redis = createRedis(redisUrl, 'producer');
  await waitForRedis(redis);
  let dns = await createDns(redis, { redisPrefix, dnsServers: [server.address] });

  /** CONCURRENCY callers, each taking the next name until none is left. */
  async function lookAll(list: string[], expectHit: boolean): Promise<number> {
    let next = 0;
    let wrong = 0;
    const caller = async () => {
      while (next < list.length) {
        const result = await dns.a(list[next++]!);
        if (result.kind !== 'answer' || result.cacheHit !== expectHit) wrong++;
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, caller));
    return wrong;
  }

  async function run(label: string, expectHit: boolean): Promise<number> {
    const started = process.hrtime.bigint();
    const wrong = await lookAll(names, expectHit);
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    const rate = LOOKUPS / seconds;
    console.log(`${label.padEnd(5)} ${LOOKUPS} lookups in ${seconds.toFixed(3)} s: ${Math.round(rate).toLocaleString('en-US')} lookups/s${wrong ? ` (${wrong} unexpected answers)` : ''}`);
    return rate;
  }

  try {
    console.log(`DNS bench: ${LOOKUPS} distinct names, concurrency ${CONCURRENCY}, server ${server.address}, Redis prefix ${redisPrefix}`);
    // Warm-up on other names so both measured passes run JIT-compiled code.
    const warmup = Array.from({ length: 1_000 }, (_, i) => `warmup-${i}.bench.test`);
    for (const name of warmup) server.set(name, { a: ['10.255.0.1'], ttl: 3600 });
    await lookAll(warmup, false);
    await lookAll(warmup, true);
    server.resetCounts();

    const cold = await run('cold', false);
    console.log(`      DNS server received ${server.count()} queries`);
    server.resetCounts();
    const warm = await run('warm', true);
    console.log(`      DNS server received ${server.count()} queries`);
    // Another process (its per-process layer empty) finds every answer in Redis.
    dns = await createDns(redis, { redisPrefix, dnsServers: [server.address] });
    await lookAll(warmup, true);
    const shared = await run('redis', true);
    console.log(`      DNS server received ${server.count()} queries`);
    console.log(`ratio warm/cold: ${(warm / cold).toFixed(1)}x (target >= 20x; warm target >= 10,000 lookups/s)`);
    console.log(`ratio redis-only warm/cold: ${(shared / cold).toFixed(1)}x (a process whose in-memory layer is empty)`);
  } finally {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${redisPrefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length) await redis.del(...keys);
    } while (cursor !== '0');
    redis.disconnect();
    await server.close();
  }
}

await main();

import autocannon, { type Result } from 'autocannon';
import { createBenchEnv, fmt, freePort, spawnService, stop } from './harness.js';

// `npm run bench:ingest`: accepted sends a second through POST /api/v2/emails against
// GET /healthz of the same server in the same run, then batch throughput (100 a call).
// The API runs alone in a child process (no workers: jobs wait in Redis), as `web` would.
const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);

const bench = await createBenchEnv('ingest');
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const api = await spawnService('src/api/server.ts', { ...bench.env, PORT: String(port) }, `${base}/healthz`);

const headers = { authorization: `Bearer ${bench.token}`, 'content-type': 'application/json' };
const one = (i: number) => ({
  from: 'Acme <hello@acme.test>',
  to: `user${i}@example.com`,
  subject: 'Your receipt',
  markdown: '# Thanks for your order\n\nYour receipt **#1234** is attached to your account. [View it](https://acme.test/r/1234).',
  tags: [{ name: 'kind', value: 'receipt' }],
});
const singleBody = JSON.stringify(one(1));
const batchBody = JSON.stringify(Array.from({ length: 100 }, (_, i) => one(i)));

async function run(title: string, options: autocannon.Options): Promise<Result> {
  const result = await autocannon({ connections: CONNECTIONS, duration: DURATION, ...options, url: `${base}${options.url ?? ''}` });
  const ok = result['2xx'];
  console.log(
    `${title.padEnd(28)} ${fmt(ok / result.duration)} ok/s   p50 ${result.latency.p50} ms   p99 ${result.latency.p99} ms   non-2xx ${result.non2xx}   errors ${result.errors}`,
  );
  return result;
}

try {
  // Warm up the JIT, the pools and the token cache.
  await autocannon({ url: `${base}/healthz`, connections: CONNECTIONS, duration: 2 });
  await autocannon({ url: `${base}/api/v2/emails`, method: 'POST', headers, body: singleBody, connections: CONNECTIONS, duration: 2 });

  const health = await run('GET /healthz', { url: '/healthz' });
  const single = await run('POST /api/v2/emails', { url: '/api/v2/emails', method: 'POST', headers, body: singleBody });
  const batch = await run('POST /api/v2/emails/batch', { url: '/api/v2/emails/batch', method: 'POST', headers, body: batchBody, connections: 8 });

  const healthRate = health['2xx'] / health.duration;
  const singleRate = single['2xx'] / single.duration;
  const batchRate = (batch['2xx'] * 100) / batch.duration;
  console.log('');
  console.log(`single sends: ${fmt(singleRate)} /s (target >= 3,000), p50 ${single.latency.p50} ms, p99 ${single.latency.p99} ms (target <= 25 ms)`);
  console.log(`ratio to GET /healthz (${fmt(healthRate)} /s): ${fmt(singleRate / healthRate, 2)}`);
  console.log(`batch: ${fmt(batchRate)} emails/s with 100 a call (target >= 20,000), p99 ${batch.latency.p99} ms`);
  const [load] = (await import('node:fs')).readFileSync('/proc/loadavg', 'utf8').split(' ');
  console.log(`load average at the end: ${load} (2 cores)`);
  const [row] = await bench.services.orm.em.fork().execute<{ n: string }[]>('select count(*) as n from emails');
  const waiting = await bench.services.producer.queue('emails').getWaitingCount();
  console.log(`rows written: ${fmt(Number(row!.n))}, jobs waiting: ${fmt(waiting)}`);
} finally {
  await stop(api);
  await bench.dispose();
}

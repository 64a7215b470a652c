import autocannon, { type Result } from 'autocannon';
import { execFile, type ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import { cpuMsOf, createBenchEnv, fmt, freePort, rssOf, spawnService, startSinkProcess, stop } from './harness.js';

// `npm run bench:ingest`: accepted sends a second through POST /api/v2/emails against
// GET /healthz of the same server in the same run, then batch throughput (100 a call).
// The API runs in a child process (compiled, as `npm start` runs it: bench/harness.ts) and, unless
// BENCH_WORKERS=0, a worker process delivers the accepted mail over SMTP to a local sink
// while the sends come in, as in production. For every phase the CPU time of each process
// (API, worker, the PostgreSQL backends serving each, Redis, the sink) is divided by the
// emails accepted, and the API's peak RSS is sampled every 100 ms.
const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const BATCH_CONNECTIONS = Number(process.env.BENCH_BATCH_CONNECTIONS ?? 8);
const WORKERS = Number(process.env.BENCH_WORKERS ?? 1);
// BENCH_ONLY=single (or keyed, batch) runs that phase alone, e.g. with BENCH_PROFILE=dir.
const ONLY = process.env.BENCH_ONLY;
const skip = (phase: string) => ONLY !== undefined && ONLY !== phase;
const exec = promisify(execFile);

const sink = await startSinkProcess();
const bench = await createBenchEnv('ingest', { MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, WORKER_QUEUES: 'emails' });
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const api = await spawnService('src/api/server.ts', { ...bench.env, PORT: String(port) }, `${base}/healthz`);
const idleRss = await rssOf(api.pid!);
console.log(`API RSS once started: ${fmt(idleRss / 1024 / 1024)} MiB`);
const workers: ChildProcess[] = [];
for (let i = 0; i < WORKERS; i++) workers.push(await spawnService('src/workers/main.ts', bench.env));
const em = bench.services.orm.em.fork();
const redisPid = Number(/process_id:(\d+)/.exec(await bench.services.redis.info('server'))?.[1] ?? 0);

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

let peakRss = 0;
const rssTimer = setInterval(() => {
  void rssOf(api.pid!).then((rss) => (peakRss = Math.max(peakRss, rss)));
}, 100);


/**
 * CPU so far of every process involved. A PostgreSQL backend is charged to the process
 * whose socket it serves (pg_stat_activity.client_port matched with `ss -tnp`).
 */
async function snapshot(): Promise<Map<string, number>> {
  const backends = await em.execute<{ pid: number; port: number }[]>(
    `select pid, client_port as port from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()`,
  );
  const owners = new Map<number, number>();
  const { stdout } = await exec('ss', ['-tnpH', 'state', 'established']);
  for (const line of stdout.split('\n')) {
    const m = /127\.0\.0\.1:(\d+)\s+\S+:5432\s+users:\(\("[^"]*",pid=(\d+)/.exec(line);
    if (m) owners.set(Number(m[1]), Number(m[2]));
  }
  const role = (pid: number | undefined) => (pid === api.pid ? 'api' : workers.some((w) => w.pid === pid) ? 'worker' : 'bench');
  const out = new Map<string, number>();
  const add = (key: string, ms: number) => out.set(key, (out.get(key) ?? 0) + ms);
  add('api', await cpuMsOf(api.pid!));
  for (const w of workers) add('worker', await cpuMsOf(w.pid!));
  add('redis', await cpuMsOf(redisPid));
  add('sink', await cpuMsOf(sink.proc.pid!));
  for (const b of backends) add(`pg:${role(owners.get(b.port))}`, await cpuMsOf(b.pid));
  return out;
}

async function delivered(): Promise<number> {
  const [row] = await em.execute<{ n: string }[]>(`select count(*) as n from emails where status in ('sent', 'failed')`);
  return Number(row!.n);
}

async function run(title: string, perCall: number, options: autocannon.Options): Promise<{ result: Result; rate: number; cpu: string }> {
  const before = await snapshot();
  const sentBefore = WORKERS ? await delivered() : 0;
  const result = await autocannon({ connections: CONNECTIONS, duration: DURATION, ...options, url: `${base}${options.url ?? ''}` });
  const after = await snapshot();
  const rss = await rssOf(api.pid!);
  const metrics = await (await fetch(`${base}/metrics`)).text();
  const gauge = (name: string) => fmt(Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)`, 'm').exec(metrics)?.[1] ?? 0) / 1024 / 1024);
  const heap = `heap used ${gauge('nodejs_heap_size_used_bytes')} of ${gauge('nodejs_heap_size_total_bytes')} MiB, external ${gauge('nodejs_external_memory_bytes')} MiB`;
  const sentAfter = WORKERS ? await delivered() : 0;
  const emails = result['2xx'] * perCall;
  const rate = (perCall ? emails : result['2xx']) / result.duration;
  const per = (key: string) => ((after.get(key) ?? 0) - (before.get(key) ?? 0)) / Math.max(1, emails);
  const keys = ['api', 'pg:api', 'redis', 'worker', 'pg:worker', 'sink'].filter((k) => after.has(k));
  const cpu = keys.map((k) => `${k} ${fmt(per(k) * 1000, 1)}`).join(', ');
  console.log(
    `${title.padEnd(28)} ${fmt(rate)} /s   p50 ${result.latency.p50} ms   p99 ${result.latency.p99} ms   non-2xx ${result.non2xx}   errors ${result.errors}` +
      (WORKERS && perCall ? `   delivered meanwhile ${fmt((sentAfter - sentBefore) / result.duration)} /s` : ''),
  );
  if (perCall) console.log(`${''.padEnd(28)} CPU µs an accepted email: ${cpu}; API RSS now ${fmt(rss / 1024 / 1024)} MiB, peak so far ${fmt(peakRss / 1024 / 1024)} MiB (${heap})`);
  return { result, rate, cpu };
}

try {
  // Warm up the JIT, the pools and the token cache.
  await autocannon({ url: `${base}/healthz`, connections: CONNECTIONS, duration: 2 });
  if (!skip('single')) await autocannon({ url: `${base}/api/v2/emails`, method: 'POST', headers, body: singleBody, connections: CONNECTIONS, duration: 2 });
  if (!skip('batch')) await autocannon({ url: `${base}/api/v2/emails/batch`, method: 'POST', headers, body: batchBody, connections: BATCH_CONNECTIONS, duration: 1 });
  if (ONLY) {
    const phase = ONLY === 'batch' ? { url: '/api/v2/emails/batch', body: batchBody, connections: BATCH_CONNECTIONS } : { url: '/api/v2/emails', body: singleBody };
    await run(ONLY, ONLY === 'batch' ? 100 : 1, { ...phase, method: 'POST', headers });
    throw new Error('BENCH_ONLY: done');
  }

  console.log(`API RSS after the warm-up: ${fmt(peakRss / 1024 / 1024)} MiB peak`);
  const health = await run('GET /healthz', 0, { url: '/healthz' });
  const single = await run('POST /api/v2/emails', 1, { url: '/api/v2/emails', method: 'POST', headers, body: singleBody });
  const keyed = await run('  with Idempotency-Key', 1, {
    url: '/api/v2/emails',
    method: 'POST',
    requests: [{ setupRequest: (req) => ({ ...req, headers: { ...headers, 'idempotency-key': `k-${Math.random().toString(36).slice(2)}` } }) }],
    body: singleBody,
  });
  const batch = await run('POST /api/v2/emails/batch', 100, { url: '/api/v2/emails/batch', method: 'POST', headers, body: batchBody, connections: BATCH_CONNECTIONS });
  clearInterval(rssTimer);

  console.log('');
  console.log(
    `single sends: ${fmt(single.rate)} /s (target >= 5,000), p50 ${single.result.latency.p50} ms, p99 ${single.result.latency.p99} ms (target <= 25 ms)${WORKERS ? `, ${WORKERS} worker(s) delivering` : ', no worker'}`,
  );
  console.log(`ratio to GET /healthz (${fmt(health.rate)} /s): ${fmt(single.rate / health.rate, 2)}`);
  console.log(`with an Idempotency-Key: ${fmt(keyed.rate)} /s, p99 ${keyed.result.latency.p99} ms (${fmt(keyed.rate / single.rate, 2)} of without)`);
  console.log(`batch: ${fmt(batch.rate)} emails/s with 100 a call (target >= 30,000), p99 ${batch.result.latency.p99} ms`);
  console.log(`API peak RSS: ${fmt(peakRss / 1024 / 1024)} MiB (target <= 150 MiB; run ${process.env.BENCH_TSX ? 'through tsx' : 'compiled (dist/), by node'}${process.env.BENCH_NODE_FLAGS ? ` ${process.env.BENCH_NODE_FLAGS}` : ''})`);
  const [load] = (await readFile('/proc/loadavg', 'utf8')).split(' ');
  console.log(`load average at the end: ${load} (2 cores)`);
  const [row] = await em.execute<{ n: string }[]>('select count(*) as n from emails');
  console.log(`rows written: ${fmt(Number(row!.n))}, delivered: ${fmt(await delivered())}`);
} finally {
  clearInterval(rssTimer);
  for (const w of workers) await stop(w);
  await stop(api);
  sink.stop();
  await bench.dispose();
}

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import autocannon from 'autocannon';
import { encodeTime } from 'ulid';
import { createBenchEnv, fmt, freePort, stop } from './harness.js';

// `npm run bench:retention`: the send rate while purge-expired deletes BENCH_PURGE_ROWS
// (default 1,000,000) old emails (each with a delivered event), against the send rate of
// the same setup without a purge, in the same run. "Send" is the whole path: an API
// process accepting POST /api/v2/emails (autocannon) and a worker process delivering them
// (file transport); both rates are reported. The purge runs in a third process, a worker
// of the maintenance queue only, as a deployment would run it (its scheduler starts it).
const ROWS = Number(process.env.BENCH_PURGE_ROWS ?? 1_000_000);
const DURATION = Number(process.env.BENCH_DURATION ?? 20);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 16);
const DAY = 86_400_000;

const bench = await createBenchEnv('retention', { MAIL_OUTBOX_DIR: `/tmp/mailroom-bench-retention-${process.pid}` });
const em = () => bench.services.orm.em.fork();
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const children: ChildProcess[] = [];

// The processes run the compiled build (dist/), as in production: they start in a fraction
// of tsx's time, which matters on a loaded machine.
if (spawnSync(process.execPath, ['scripts/ensure-build.mjs'], { stdio: 'inherit' }).status !== 0) throw new Error('build failed');
async function start(entry: string, env: Record<string, string>, readyUrl?: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, [entry], { env: { ...process.env, ...env }, stdio: ['ignore', 'inherit', 'inherit'] });
  children.push(child);
  for (const t0 = Date.now(); readyUrl; ) {
    if (await fetch(readyUrl).then((r) => r.ok, () => false)) break;
    if (Date.now() - t0 > 120_000) throw new Error(`${entry} did not start in 2 minutes`);
    await new Promise((r) => setTimeout(r, 200));
  }
  return child;
}

const body = JSON.stringify({
  from: 'Acme <hello@acme.test>',
  to: 'user@example.com',
  subject: 'Your receipt',
  markdown: '# Thanks for your order\n\nYour receipt **#1234** is ready. [View it](https://acme.test/r/1234).',
});
const headers = { authorization: `Bearer ${bench.token}`, 'content-type': 'application/json' };

let recentFrom = '';
const sentCount = async () => Number((await em().execute<{ n: string }[]>(`select count(*) as n from emails where status = 'sent' and id >= ?`, [recentFrom]))[0]!.n);
const oldCount = async (cutoffId: string) =>
  Number((await em().execute<{ n: string }[]>('select count(*) as n from (select 1 from emails where id < ? limit 10000000) o', [cutoffId]))[0]!.n);

/** Accepted sends a second (API) and delivered a second (worker) over DURATION seconds. */
async function sendPhase(title: string): Promise<{ accepted: number; delivered: number }> {
  const before = await sentCount();
  const t0 = Date.now();
  const result = await autocannon({ url: `${base}/api/v2/emails`, method: 'POST', headers, body, connections: CONNECTIONS, duration: DURATION });
  const seconds = (Date.now() - t0) / 1000;
  const delivered = (await sentCount()) - before;
  const rates = { accepted: result['2xx'] / result.duration, delivered: delivered / seconds };
  console.log(
    `${title.padEnd(22)} accepted ${fmt(rates.accepted)}/s (p99 ${result.latency.p99} ms, non-2xx ${result.non2xx})   delivered ${fmt(rates.delivered)}/s`,
  );
  return rates;
}

try {
  // Seed: ROWS sent emails 40 days old, each with a delivered event, in one statement each.
  const oldTime = encodeTime(Date.now() - 40 * DAY, 10).toLowerCase();
  const t0 = Date.now();
  await em().execute(
    `insert into emails (id, organization_id, status, delivery_status, from_address, to_address, subject, content_kind, content, html, text, message_id, sent_at, created_at, updated_at)
     select 'eml_' || ? || lpad(i::text, 16, '0'), ?, 'sent', 'delivered', 'hello@acme.test', 'user' || i || '@example.com', 'Your receipt',
            'markdown', '# Thanks for your order', '<p>Thanks for your order</p>', 'Thanks for your order', 'm' || i || '@acme.test', t, t, t
       from generate_series(1, ?) as i, (select now() - interval '40 days' as t) as at`,
    [oldTime, bench.organizationId, ROWS],
    'run',
  );
  await em().execute(
    `insert into email_events (email_id, organization_id, type, occurred_at) select id, organization_id, 'delivered', created_at from emails`,
    [],
    'run',
  );
  await em().execute('vacuum analyze emails', [], 'run').catch(() => {});
  await em().execute('vacuum analyze email_events', [], 'run').catch(() => {});
  console.log(`seeded ${fmt(ROWS)} emails 40 days old, with ${fmt(ROWS)} events, in ${fmt((Date.now() - t0) / 1000, 1)} s`);
  const cutoffId = `eml_${encodeTime(Date.now() - 30 * DAY, 10).toLowerCase()}`;
  recentFrom = `eml_${encodeTime(Date.now() - DAY, 10).toLowerCase()}`;

  await start('dist/api/server.js', { ...bench.env, PORT: String(port) }, `${base}/healthz`);
  await start('dist/workers/main.js', { ...bench.env, WORKER_QUEUES: 'emails' });
  // Warm up the JIT, the pools, the token cache.
  await autocannon({ url: `${base}/api/v2/emails`, method: 'POST', headers, body, connections: CONNECTIONS, duration: 3 });

  // The worker is up once the warm-up's emails are being delivered.
  for (let i = 0; i < 600 && (await sentCount()) === 0; i += 1) await new Promise((r) => setTimeout(r, 100));

  const without = await sendPhase('without purge');

  // The purge: a maintenance worker, whose job scheduler runs purge-expired at once.
  const purgeStarted = Date.now();
  await start('dist/workers/main.js', { ...bench.env, WORKER_QUEUES: 'maintenance' });
  // Measure once it has begun deleting.
  for (let i = 0; i < 300 && (await oldCount(cutoffId)) >= ROWS; i += 1) await new Promise((r) => setTimeout(r, 100));
  const during = await sendPhase('during purge');
  const leftAfterPhase = await oldCount(cutoffId);
  for (;;) {
    const left = await oldCount(cutoffId);
    if (left === 0) break;
    if (Date.now() - purgeStarted > 900_000) throw new Error(`purge did not finish in 15 minutes (${left} left)`);
    await new Promise((r) => setTimeout(r, 500));
  }
  const purgeSeconds = (Date.now() - purgeStarted) / 1000;
  // The machine's load drifts: the baseline is the mean of a phase before and one after.
  const after = await sendPhase('after purge');
  const baseline = { accepted: (without.accepted + after.accepted) / 2, delivered: (without.delivered + after.delivered) / 2 };
  const events = Number((await em().execute<{ n: string }[]>(`select count(*) as n from email_events where email_id < ?`, [cutoffId]))[0]!.n);

  const [load] = readFileSync('/proc/loadavg', 'utf8').split(' ');
  console.log('');
  console.log(`purge: ${fmt(ROWS)} emails (and their events: ${fmt(events)} left) in ${fmt(purgeSeconds, 1)} s = ${fmt(ROWS / purgeSeconds)} rows/s; ${fmt(leftAfterPhase)} were still left when the measured phase ended (it ran during the whole phase: ${leftAfterPhase > 0})`);
  console.log(`ratio accepted during / without (mean of before and after): ${fmt(during.accepted / baseline.accepted, 2)} (target >= 0.8)`);
  console.log(`ratio delivered during / without (mean of before and after): ${fmt(during.delivered / baseline.delivered, 2)} (target >= 0.8)`);
  console.log(`load average at the end: ${load} (2 cores)`);
} finally {
  for (const child of children.reverse()) await stop(child);
  await bench.dispose();
}

import { readFile } from 'node:fs/promises';
import type { ChildProcess } from 'node:child_process';
import { newEmailFromBody, SendEmailBody } from '../src/shared/emails/input.js';
import { insertEmails, sendJob } from '../src/shared/emails/service.js';
import { createBenchEnv, fmt, freePort, spawnService, startSinkProcess, stop } from './harness.js';

// `npm run bench:backlog`: a backlog accepted by batch calls as fast as the API takes them,
// then the drain. In one run:
// 1. the empty-queue rate: BASELINE queued emails (as `bench:deliver` seeds them) drained by
//    the worker, nothing else queued;
// 2. CLIENTS clients post batches of 100 until TOTAL emails are accepted (the worker runs);
// 3. one transactional email sent right after: its time to reach the sink (it must overtake
//    the backlog);
// 4. the drain rate over the following DRAIN_S seconds, against the rate of 1.
// Every second: the sink's count, the queue's job counts, the worker's PostgreSQL activity
// and the `emails` table's statistics, to find what a stall is made of.
const TOTAL = Number(process.env.BENCH_EMAILS ?? 250_000);
const BASELINE = Number(process.env.BENCH_BASELINE ?? 20_000);
const CLIENTS = Number(process.env.BENCH_CLIENTS ?? 50);
const DRAIN_S = Number(process.env.BENCH_DRAIN_S ?? 60);

const sink = await startSinkProcess();
let probeAt: number | undefined;
sink.proc.on('message', (m: { probe?: string; at?: number }) => {
  if (m.probe) probeAt = m.at;
});

const port = await freePort();
const bench = await createBenchEnv('backlog', { MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, PORT: String(port), WORKER_QUEUES: 'emails' });
const base = `http://127.0.0.1:${port}`;
const auth = { authorization: `Bearer ${bench.token}`, 'content-type': 'application/json' };
const message = (to: string) => ({ from: 'Acme <receipts@acme.test>', to, subject: 'Your receipt', html: '<h1>Thanks for your order</h1><p>Your receipt <b>#1234</b> is ready.</p>' });

let api: ChildProcess | undefined;
let worker: ChildProcess | undefined;
const em = bench.services.orm.em.fork();
const queue = bench.services.producer.queue('emails');

async function sample(label: string, t0: number, last: { at: number; sink: number }) {
  const now = Date.now();
  const sent = await sink.count();
  const counts = await queue.getJobCounts('wait', 'prioritized', 'active', 'delayed', 'completed');
  // What holds the worker's concurrency slots: sends or batch expansions.
  const active = await queue.getActive(0, 199);
  const batches = active.filter((j) => j?.name === 'send-batch').length;
  const activity = await em.execute<{ q: string; n: number }[]>(
    `select left(regexp_replace(query, '\\s+', ' ', 'g'), 40) as q, count(*)::int as n from pg_stat_activity
     where datname = current_database() and state = 'active' and pid <> pg_backend_pid() group by 1 order by 2 desc limit 3`,
  );
  const [table] = await em.execute<{ live: number; seq: number; idx: number; analyzed: number; autoanalyzed: number }[]>(
    `select n_live_tup::int as live, seq_scan::int as seq, coalesce(idx_scan, 0)::int as idx, analyze_count::int as analyzed, autoanalyze_count::int as autoanalyzed
     from pg_stat_user_tables where relname = 'emails'`,
  );
  const rate = ((sent - last.sink) * 1000) / (now - last.at);
  console.log(
    `${label} t=${fmt((now - t0) / 1000, 0)}s sink=${fmt(sent)} (+${fmt(rate)}/s) wait=${counts.wait} prio=${counts.prioritized} active=${counts.active} (${batches} send-batch) delayed=${counts.delayed} | emails live=${table?.live} seq_scan=${table?.seq} idx_scan=${table?.idx} analyze=${table?.analyzed}/${table?.autoanalyzed} | pg active: ${activity.map((a) => `${a.n}x ${a.q}`).join('; ')}`,
  );
  return { at: now, sink: sent };
}

try {
  // 1. The empty-queue rate (bench:deliver's measurement).
  for (let done = 0; done < BASELINE; done += 1000) {
    const body = SendEmailBody.parse(message('x@example.com'));
    const inputs = Array.from({ length: Math.min(1000, BASELINE - done) }, (_, i) => ({ ...newEmailFromBody(bench.organizationId, body), to: `base${done + i}@example.com` }));
    await bench.services.producer.addBulk('emails', (await insertEmails(em, inputs)).map(sendJob));
  }
  worker = await spawnService('src/workers/main.ts', bench.env);
  for (const t0 = Date.now(); (await sink.count()) < BASELINE; ) {
    if (Date.now() - t0 > 300_000) throw new Error('baseline did not drain');
    await new Promise((r) => setTimeout(r, 200));
  }
  const [span] = await em.execute<{ first: Date; last: Date; n: string }[]>(`select min(claimed_at) as first, max(sent_at) as last, count(*) as n from emails where status = 'sent'`);
  const baselineRate = Number(span!.n) / ((new Date(span!.last).getTime() - new Date(span!.first).getTime()) / 1000);
  console.log(`empty-queue rate: ${fmt(baselineRate)} emails/s (${fmt(BASELINE)} emails)`);

  // 2. The burst.
  api = await spawnService('src/api/server.ts', bench.env, `${base}/readyz`);
  const t0 = Date.now();
  let last = { at: t0, sink: await sink.count() };
  const sinkAtBurst = last.sink;
  let accepted = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      await new Promise((r) => setTimeout(r, 1000));
      if (sampling) last = await sample('burst', t0, last);
    }
  })();
  let n = 0;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      while (accepted < TOTAL) {
        const b = n++;
        accepted += 100;
        const res = await fetch(`${base}/api/v2/emails/batch`, { method: 'POST', headers: auth, body: JSON.stringify(Array.from({ length: 100 }, (_, i) => message(`u${b}-${i}@example.com`))) });
        if (res.status !== 200) throw new Error(`batch: ${res.status} ${await res.text()}`);
        await res.arrayBuffer();
      }
    }),
  );
  sampling = false;
  await sampler;
  const burstS = (Date.now() - t0) / 1000;
  const sinkAfterBurst = await sink.count();
  console.log(`accepted ${fmt(accepted)} emails in ${fmt(burstS, 1)} s = ${fmt(accepted / burstS)}/s; delivered during the burst: ${fmt((sinkAfterBurst - sinkAtBurst) / burstS)}/s`);

  // 3. One transactional email, right away.
  const probeSent = Date.now();
  const res = await fetch(`${base}/api/v2/emails`, { method: 'POST', headers: auth, body: JSON.stringify(message('probe@example.org')) });
  if (res.status !== 200) throw new Error(`probe: ${res.status}`);

  // 4. The drain over the following DRAIN_S seconds.
  const d0 = Date.now();
  const drainStart = await sink.count();
  last = { at: d0, sink: drainStart };
  while (Date.now() - d0 < DRAIN_S * 1000) {
    await new Promise((r) => setTimeout(r, 1000));
    last = await sample('drain', d0, last);
  }
  const drained = (await sink.count()) - drainStart;
  const drainRate = drained / ((Date.now() - d0) / 1000);
  const probeMs = probeAt === undefined ? undefined : probeAt - probeSent;

  const plan = await em.execute<{ 'QUERY PLAN': string }[]>(
    `explain (analyze, buffers) update emails e set updated_at = e.updated_at from (select id from emails where status = 'queued' order by id limit 200) c where e.id = c.id and e.status = 'queued'`,
  );
  console.log(plan.map((p) => p['QUERY PLAN']).join('\n'));
  const [load] = await readFile('/proc/loadavg', 'utf8').then((s) => s.split(' '));
  console.log('');
  console.log(`empty-queue rate ${fmt(baselineRate)} emails/s; drain over ${DRAIN_S} s after ${fmt(accepted)} accepted: ${fmt(drainRate)} emails/s`);
  console.log(`ratio drain / empty-queue: ${fmt(drainRate / baselineRate, 2)} (target >= 0.9)`);
  console.log(`transactional email sent after the burst reached the sink in ${probeMs === undefined ? 'more than the drain window' : `${fmt(probeMs)} ms`} (target <= 2,000 ms)`);
  console.log(`load average: ${load} (2 cores)`);
} finally {
  if (api) await stop(api);
  if (worker) await stop(worker);
  sink.stop();
  await bench.dispose();
}

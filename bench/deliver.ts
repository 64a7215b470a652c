import type { ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import nodemailer from 'nodemailer';
import { newEmailFromBody, SendEmailBody } from '../src/shared/emails/input.js';
import { renderEmail } from '../src/shared/emails/render.js';
import { insertEmails, sendJob } from '../src/shared/emails/service.js';
import { smtpConnection } from '../src/shared/emails/transport.js';
import { cpuMsOf, createBenchEnv, fmt, rssOf, spawnService, startSinkProcess, stop } from './harness.js';

// `npm run bench:deliver`: N queued emails through a worker process (render, claim, send
// over pooled SMTP, record) to a local SMTP sink, against nodemailer sending the same
// pre-rendered message to the same sink directly, in the same run.
const TOTAL = Number(process.env.BENCH_EMAILS ?? 20_000);
const DIRECT_CONCURRENCY = 64;
const MAX_CONNECTIONS = 16; // as the service's SMTP pool

const sink = await startSinkProcess();

const bench = await createBenchEnv('deliver', { MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, WORKER_QUEUES: 'emails' });
const body = SendEmailBody.parse({
  from: 'Acme <receipts@acme.test>',
  to: 'user@example.com',
  subject: 'Your receipt',
  markdown: '# Thanks for your order\n\nYour receipt **#1234** is ready.\n\n| item | price |\n|---|---|\n| Pro plan | $10 |\n\n[View it](https://acme.test/r/1234)',
  preview: 'Receipt #1234',
});

// BENCH_WORKERS=N: N worker processes sharing the same SMTP connection count (16 / N each).
const WORKERS = Number(process.env.BENCH_WORKERS ?? 1);
let workers: ChildProcess[] = [];
try {
  // Seed: TOTAL queued rows and their jobs, before any worker runs.
  const em = bench.services.orm.em.fork();
  for (let done = 0; done < TOTAL; done += 1000) {
    const inputs = Array.from({ length: Math.min(1000, TOTAL - done) }, (_, i) => ({ ...newEmailFromBody(bench.organizationId, body), to: `user${done + i}@example.com` }));
    const ids = await insertEmails(em, inputs);
    await bench.services.producer.addBulk('emails', ids.map(sendJob));
  }
  console.log(`seeded ${fmt(TOTAL)} queued emails`);

  // 1. Through the workers.
  let peakRss = 0;
  workers = await Promise.all(
    Array.from({ length: WORKERS }, () => spawnService('src/workers/main.ts', { ...bench.env, SMTP_MAX_CONNECTIONS: String(Math.max(1, Math.round(MAX_CONNECTIONS / WORKERS))) })),
  );
  const rssTimer = setInterval(() => {
    for (const worker of workers) void rssOf(worker.pid!).then((rss) => (peakRss = Math.max(peakRss, rss)));
  }, 200);
  const workersCpuMs = async () => (await Promise.all(workers.map((w) => cpuMsOf(w.pid!)))).reduce((a, b) => a + b, 0);
  // The PostgreSQL backends serving the worker (PostgreSQL runs on this host) and the sink:
  // their CPU an email too, since they share the cores with the worker.
  const otherCpuMs = async () => {
    const backends = await em.execute<{ pid: number }[]>(`select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()`);
    const pids = new Map<string, number>([['sink', sink.proc.pid!], ...backends.map((b) => [`pg${b.pid}`, b.pid] as [string, number])]);
    const [stats] = await em.execute<{ commits: string }[]>(`select xact_commit as commits from pg_stat_database where datname = current_database()`);
    const out = new Map<string, number>([['commits', Number(stats!.commits)]]);
    for (const [name, pid] of pids) out.set(name, await cpuMsOf(pid));
    return out;
  };
  const started = Date.now();
  let warm: { cpu: number; done: number; others: Map<string, number> } | undefined;
  for (;;) {
    const [row] = await em.execute<{ n: string }[]>(`select count(*) as n from emails where status in ('sent', 'failed')`);
    if (!warm && Number(row!.n) > 0) warm = { cpu: await workersCpuMs(), done: Number(row!.n), others: await otherCpuMs() };
    if (Number(row!.n) >= TOTAL) break;
    if (Date.now() - started > 600_000) throw new Error('workers did not finish in 10 minutes');
    await new Promise((r) => setTimeout(r, 100));
  }
  clearInterval(rssTimer);
  const workerCpuMs = await workersCpuMs();
  const steadyCpuMs = (workerCpuMs - warm!.cpu) / (TOTAL - warm!.done);
  const others = await otherCpuMs();
  const spent = (prefix: string) =>
    [...others].filter(([name]) => name.startsWith(prefix)).reduce((sum, [name, ms]) => sum + ms - (warm!.others.get(name) ?? 0), 0) / (TOTAL - warm!.done);
  const sinkSteadyMs = spent('sink');
  const pgSteadyMs = spent('pg');
  // Transactions (statements outside a transaction) an email, the poll of this loop included.
  const commitsPerEmail = spent('commits');
  const [span] = await em.execute<{ first: Date; last: Date; sent: string; failed: string }[]>(
    `select min(claimed_at) as first, max(sent_at) as last, count(*) filter (where status = 'sent') as sent, count(*) filter (where status = 'failed') as failed from emails`,
  );
  const seconds = (new Date(span!.last).getTime() - new Date(span!.first).getTime()) / 1000;
  const workerRate = Number(span!.sent) / seconds;
  await Promise.all(workers.map((w) => stop(w)));
  workers = [];
  const received = await sink.count();

  // 2. nodemailer straight to the same sink, the same message pre-rendered: run after the
  // workers and again after a pause, and averaged, since the machine's load drifts.
  const rendered = renderEmail({ contentKind: 'markdown', content: body.markdown!, subject: body.subject, preview: body.preview });
  const direct = async () => {
    const transport = nodemailer.createTransport({ ...smtpConnection(sink.url), pool: true, maxConnections: MAX_CONNECTIONS, maxMessages: Infinity });
    let next = 0;
    const cpu = process.cpuUsage();
    const t0 = Date.now();
    await Promise.all(
      Array.from({ length: DIRECT_CONCURRENCY }, async () => {
        while (next < TOTAL) {
          const i = next++;
          await transport.sendMail({ from: body.from, to: `user${i}@example.com`, subject: body.subject, html: rendered.html, text: rendered.text, messageId: `<direct${i}@acme.test>` });
        }
      }),
    );
    const rate = TOTAL / ((Date.now() - t0) / 1000);
    const usage = process.cpuUsage(cpu);
    transport.close();
    return { rate, cpuMs: (usage.user + usage.system) / 1000 / TOTAL };
  };
  const runs = [await direct()];
  await new Promise((r) => setTimeout(r, 2_000));
  runs.push(await direct());
  const directRate = (runs[0]!.rate + runs[1]!.rate) / 2;
  const directCpuMs = ((runs[0]!.cpuMs + runs[1]!.cpuMs) / 2) * TOTAL;

  console.log('');
  console.log(`workers: ${fmt(Number(span!.sent))} sent, ${span!.failed} failed in ${fmt(seconds, 2)} s = ${fmt(workerRate)} emails/s (target >= 800); sink received ${fmt(received)}`);
  console.log(`worker processes: ${WORKERS}; peak RSS of one: ${fmt(peakRss / 1024 / 1024)} MiB; workers' CPU ${fmt(steadyCpuMs, 3)} ms an email once started (start-up: ${fmt(warm!.cpu)} ms)`);
  console.log(`PostgreSQL backends of the worker: ${fmt(pgSteadyMs, 3)} ms CPU an email, ${fmt(commitsPerEmail, 2)} commits an email; SMTP sink: ${fmt(sinkSteadyMs, 3)} ms an email`);
  console.log(`direct nodemailer (same message pre-rendered, pool of ${MAX_CONNECTIONS}): ${fmt(directRate)} emails/s (runs: ${runs.map((r) => fmt(r.rate)).join(', ')}); CPU ${fmt(directCpuMs / TOTAL, 3)} ms an email`);
  const [load] = await readFile('/proc/loadavg', 'utf8').then((s) => s.split(' '));
  console.log(`load average during the run: ${load} (2 cores)`);
  console.log(`ratio workers / direct: ${fmt(workerRate / directRate, 2)} (target >= 0.8 with the same connection count)`);
} finally {
  await Promise.all(workers.map((w) => stop(w)));
  sink.stop();
  await bench.dispose();
}

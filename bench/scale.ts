import type { ChildProcess } from 'node:child_process';
import { readdir, readFile } from 'node:fs/promises';
import { newEmailFromBody, SendEmailBody } from '../src/shared/emails/input.js';
import { insertEmails, sendJob } from '../src/shared/emails/service.js';
import { createBenchEnv, fmt, spawnService, stop, startSinkProcess } from './harness.js';

// `npm run bench:scale`: delivery throughput to a local SMTP sink (a process of its own)
// with 1 worker process, then with 2, in the same run: BENCH_EMAILS queued emails each
// (default 10,000). Prints emails/s, the ratio, and the CPU each party used, which shows
// what bounds the second worker (the machine's cores, PostgreSQL, the sink).
const TOTAL = Number(process.env.BENCH_EMAILS ?? 10_000);

const sink = await startSinkProcess();

const bench = await createBenchEnv('scale', { MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, WORKER_QUEUES: 'emails' });
const body = SendEmailBody.parse({
  from: 'Acme <receipts@acme.test>',
  to: 'user@example.com',
  subject: 'Your receipt',
  markdown: '# Thanks for your order\n\nYour receipt **#1234** is ready.\n\n| item | price |\n|---|---|\n| Pro plan | $10 |\n\n[View it](https://acme.test/r/1234)',
  preview: 'Receipt #1234',
});

/** CPU ticks (user + system, 1/100 s) of a process. */
async function ticks(pid: number): Promise<number> {
  try {
    const stat = (await readFile(`/proc/${pid}/stat`, 'utf8')).split(') ')[1]!.split(' ');
    return Number(stat[11]) + Number(stat[12]);
  } catch {
    return 0;
  }
}

/** Pids of the machine's processes named `comm` (postgres backends, redis-server). */
async function pidsNamed(comm: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const name = await readFile(`/proc/${entry}/comm`, 'utf8').catch(() => '');
    if (name.trim() === comm) pids.push(Number(entry));
  }
  return pids;
}

async function ticksOf(pids: number[]): Promise<number> {
  let total = 0;
  for (const pid of pids) total += await ticks(pid);
  return total;
}

async function machineTicks(): Promise<{ busy: number; total: number }> {
  const cpu = (await readFile('/proc/stat', 'utf8')).split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const idle = cpu[3]! + cpu[4]!;
  const total = cpu.reduce((a, b) => a + b, 0);
  return { busy: total - idle, total };
}

interface Run {
  workers: number;
  rate: number;
  seconds: number;
  cpu: { workers: number; postgres: number; redis: number; sink: number; machine: number };
}

let children: ChildProcess[] = [];
let seeded = 0;

async function run(workers: number): Promise<Run> {
  // Seed: TOTAL queued rows and their jobs, the queue paused until the workers are up.
  const queue = bench.services.producer.queue('emails');
  await queue.pause();
  const em = bench.services.orm.em.fork();
  for (let done = 0; done < TOTAL; done += 1000) {
    const inputs = Array.from({ length: Math.min(1000, TOTAL - done) }, (_, i) => ({ ...newEmailFromBody(bench.organizationId, body), to: `user${seeded + done + i}@example.com` }));
    const ids = await insertEmails(em, inputs);
    await bench.services.producer.addBulk('emails', ids.map(sendJob));
  }
  seeded += TOTAL;
  await em.execute(`vacuum analyze emails`);
  const sentBefore = await sink.count();

  // The worker processes' start-up (tsx, imports, connections) is not measured: they start
  // on the paused queue, and the clocks start when it is resumed.
  children = await Promise.all(Array.from({ length: workers }, () => spawnService('src/workers/main.ts', bench.env)));
  for (const waitStart = Date.now(); (await queue.getWorkersCount()) < workers; ) {
    if (Date.now() - waitStart > 60_000) throw new Error('workers did not start');
    await new Promise((r) => setTimeout(r, 100));
  }
  await new Promise((r) => setTimeout(r, 1_000)); // their connections and pools settle
  // The backends serving this benchmark's database (the workers' pools included); other
  // databases' backends on the same server are not counted.
  const postgres = (await em.execute<{ pid: number }[]>(`select pid from pg_stat_activity where datname = current_database()`)).map((r) => Number(r.pid));
  const redis = await pidsNamed('redis-server');
  const before = { workers: await ticksOf(children.map((c) => c.pid!)), pg: await ticksOf(postgres), redis: await ticksOf(redis), sink: await ticks(sink.proc.pid!), machine: await machineTicks() };
  await queue.resume();
  const started = Date.now();
  for (;;) {
    const [row] = await em.execute<{ n: string }[]>(`select count(*) as n from emails where status in ('sent', 'failed')`);
    if (Number(row!.n) >= seeded) break;
    if (Date.now() - started > 600_000) throw new Error('workers did not finish in 10 minutes');
    await new Promise((r) => setTimeout(r, 100));
  }
  const workerTicks = (await ticksOf(children.map((c) => c.pid!))) - before.workers;
  const after = { pg: await ticksOf(postgres), redis: await ticksOf(redis), sink: await ticks(sink.proc.pid!), machine: await machineTicks() };
  await Promise.all(children.map(stop));
  children = [];

  // From the first claim to the last sent record of this run's emails.
  const [span] = await em.execute<{ first: Date; last: Date; sent: string }[]>(
    `select min(claimed_at) as first, max(sent_at) as last, count(*) as sent from emails where status = 'sent' and sent_at >= now() - interval '10 minutes' and claimed_at is not null and id in (select id from emails order by id desc limit ?)`,
    [TOTAL],
  );
  const seconds = (new Date(span!.last).getTime() - new Date(span!.first).getTime()) / 1000;
  const received = (await sink.count()) - sentBefore;
  if (received !== TOTAL) console.warn(`warning: the sink received ${received} of ${TOTAL}`);
  const machineShare = (after.machine.busy - before.machine.busy) / (after.machine.total - before.machine.total);
  const perEmail = (t: number) => ((t / 100) * 1000) / TOTAL; // ms of CPU an email
  return {
    workers,
    rate: Number(span!.sent) / seconds,
    seconds,
    cpu: {
      workers: perEmail(workerTicks),
      postgres: perEmail(after.pg - before.pg),
      redis: perEmail(after.redis - before.redis),
      sink: perEmail(after.sink - before.sink),
      machine: machineShare,
    },
  };
}

try {
  // BENCH_ORDER=21 measures 2 workers first (to rule out an effect of the order).
  const twoFirst = process.env.BENCH_ORDER === '21';
  const first = await run(twoFirst ? 2 : 1);
  const second = await run(twoFirst ? 1 : 2);
  const [one, two] = twoFirst ? [second, first] : [first, second];
  console.log('');
  console.log(`${fmt(TOTAL)} emails a run, SMTP sink in a process of its own, ${(await readFile('/proc/cpuinfo', 'utf8')).match(/^processor/gm)?.length} cores`);
  console.log('| workers | emails/s | s | CPU ms an email: workers | PostgreSQL | Redis | sink | machine busy |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const r of [one, two]) {
    console.log(
      `| ${r.workers} | ${fmt(r.rate)} | ${fmt(r.seconds, 1)} | ${fmt(r.cpu.workers, 3)} | ${fmt(r.cpu.postgres, 3)} | ${fmt(r.cpu.redis, 3)} | ${fmt(r.cpu.sink, 3)} | ${fmt(r.cpu.machine * 100)}% |`,
    );
  }
  const [load] = (await readFile('/proc/loadavg', 'utf8')).split(' ');
  console.log(`load average at the end: ${load}`);
  console.log(`ratio 2 workers / 1 worker: ${fmt(two.rate / one.rate, 2)} (expected about 1.5 on 2 cores)`);
  // What the CPU costs above allow on this machine's cores if nothing else ran: one worker
  // process is one event loop (at most one core); everything together shares all cores.
  const cores = (await readFile('/proc/cpuinfo', 'utf8')).match(/^processor/gm)?.length ?? 1;
  const total = (r: Run) => r.cpu.workers + r.cpu.postgres + r.cpu.redis + r.cpu.sink;
  const ceilingOne = Math.min(1000 / one.cpu.workers, (cores * 1000) / total(one));
  const ceilingTwo = Math.min((2 * 1000) / two.cpu.workers, (cores * 1000) / total(two));
  console.log(
    `CPU-bound ceiling on an idle machine of ${cores} cores from these costs: 1 worker ${fmt(ceilingOne)} emails/s, 2 workers ${fmt(ceilingTwo)} emails/s, ratio ${fmt(ceilingTwo / ceilingOne, 2)}`,
  );
} finally {
  await Promise.all(children.map(stop));
  sink.stop();
  await bench.dispose();
}

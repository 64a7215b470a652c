// Bounces by mail: reports processed per second from DSNs delivered over 4 SMTP connections,
// against the rate at which the same listener accepts messages it discards.
//
//   npm run bench:inbound            (BENCH_INBOUND_COUNT=10000, BENCH_INBOUND_ROUNDS=3 by default)
//   BENCH_PROFILE=/tmp/inbound.cpuprofile npm run bench:inbound   (a CPU profile of the
//   client and listener while the first round's reports are stored, for Chrome's DevTools)
//
// Baseline: the listener (same SMTP server, same RCPT check of every return path) whose
// `accept` drops each message. Measured: the production path, each report stored in
// PostgreSQL, enqueued (reports stored within 100 ms share a job), read by a worker process
// (the report reader, the set-based outcome recorder in one transaction a job), timed from
// the first message until the last report is read. The two alternate, round after round, and
// the figure is the median of the rounds' ratios.
import { readFileSync, writeFileSync } from 'node:fs';
import nodemailer from 'nodemailer';
import { loadavg } from 'node:os';
import { startInbound } from '../src/inbound/server.js';
import { smtpConnection } from '../src/shared/emails/transport.js';
import { cpuMsOf, cpuMsOfCommand, createBenchEnv, fmt, freePort, median, seedSentEmails, spawnService, stop } from './harness.js';

const COUNT = Number(process.env.BENCH_INBOUND_COUNT ?? 10_000);
// Each round measures the discarding listener, then the production path, on DSNs of its own:
// the ratio of each pair is taken minutes apart at most, and the median of the rounds is the
// figure (one pair alone moved between 0.34 and 0.61 on this machine).
const ROUNDS = Number(process.env.BENCH_INBOUND_ROUNDS ?? 3);
const CONNECTIONS = 4;
const BOUNCE_DOMAIN = 'bounces.bench.test';

/** CPU (user + system, ms) this process used since `start`. */
const cpuMsSince = (start: NodeJS.CpuUsage) => {
  const used = process.cpuUsage(start);
  return (used.user + used.system) / 1000;
};

/** A CPU profile of this process (client and listener) from now until `stopTo(file)`. */
async function startProfile() {
  const { Session } = await import('node:inspector/promises');
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.start');
  return {
    async stopTo(file: string) {
      const { profile } = await session.post('Profiler.stop');
      writeFileSync(file, JSON.stringify(profile));
      session.disconnect();
    },
  };
}

const bench = await createBenchEnv('inbound', { BOUNCE_DOMAIN });
const { services } = bench;
try {
  const template = readFileSync(new URL('../test/fixtures/bounces/postfix-dsn.eml', import.meta.url), 'utf8').replace(/\r?\n/g, '\r\n');
  /** COUNT DSNs, one for each of COUNT new emails marked sent (every round bounces emails of its own). */
  async function newReports() {
    const ids = await seedSentEmails(bench, COUNT, '<p>Hello</p>');
    return ids.map((id, i) => {
      const returnPath = services.returnPaths.address(id, BOUNCE_DOMAIN);
      const raw = template
        .replaceAll('{{RETURN_PATH}}', returnPath)
        .replaceAll('{{RECIPIENT}}', `reader${i}@example.com`)
        .replaceAll('{{MESSAGE_ID}}', `${id}@bench.test`)
        .replaceAll('{{FROM}}', 'news@bench.test')
        .replaceAll('{{SUBJECT}}', 'Bench');
      return { returnPath, raw };
    });
  }

  /** Delivers every report over CONNECTIONS pooled SMTP connections; seconds taken. */
  async function deliverAll(port: number, reports: { returnPath: string; raw: string }[]): Promise<number> {
    // The service's own client options (TCP_NODELAY sockets: without them each message waits
    // ~40 ms for a delayed ACK, and both figures measure that instead).
    const client = nodemailer.createTransport({ ...smtpConnection(`smtp://127.0.0.1:${port}`), pool: true, maxConnections: CONNECTIONS, maxMessages: Infinity, ignoreTLS: true });
    const started = performance.now();
    await Promise.all(reports.map((r) => client.sendMail({ envelope: { from: '', to: [r.returnPath] }, raw: r.raw })));
    const seconds = (performance.now() - started) / 1000;
    client.close();
    return seconds;
  }

  const em = services.orm.em.fork();
  const count = async (status: string) => {
    const [row] = await em.execute<{ n: number }[]>(`select count(*)::int as n from inbound_reports where status = ?`, [status], 'all');
    return row!.n;
  };

  // The production path's reader: a worker process of its own (the `worker` role,
  // WORKER_QUEUES=inbound), as in production, kept for every round.
  const metricsPort = await freePort();
  const worker = await spawnService('src/workers/main.ts', { ...bench.env, WORKER_QUEUES: 'inbound', WORKER_METRICS_PORT: String(metricsPort) }, `http://127.0.0.1:${metricsPort}/readyz`);
  const load = loadavg()[0]!;
  const rounds: { discardRate: number; acceptRate: number; processRate: number; spent: Record<'bench' | 'worker' | 'postgres' | 'redis', number> }[] = [];
  const perReport = (ms: number) => `${fmt((ms * 1000) / COUNT)} us`;
  console.log(`inbound: ${fmt(COUNT)} DSNs over ${CONNECTIONS} SMTP connections a measurement, ${ROUNDS} rounds (load average ${fmt(load, 1)})`);
  try {
    for (let round = 1; round <= ROUNDS; round++) {
      const reports = await newReports();

      // Baseline: the listener discarding what it accepts.
      let discarded = 0;
      const discard = await startInbound(services, { port: 0, accept: async () => void discarded++ });
      const discardCpu = process.cpuUsage();
      const discardSeconds = await deliverAll(discard.port, reports);
      const discardCpuMs = cpuMsSince(discardCpu);
      await discard.close();
      if (discarded !== COUNT) throw new Error(`the discarding listener accepted ${discarded} of ${COUNT}`);

      // The production path: stored and enqueued by the listener, read and applied by the worker.
      const applied = await count('applied');
      const listener = await startInbound(services, { port: 0 });
      const profiler = process.env.BENCH_PROFILE && round === 1 ? await startProfile() : undefined;
      const before = { bench: process.cpuUsage(), worker: await cpuMsOf(worker.pid!), postgres: await cpuMsOfCommand('postgres'), redis: await cpuMsOfCommand('redis-server') };
      const started = performance.now();
      const acceptSeconds = await deliverAll(listener.port, reports);
      let last = { unread: -1, at: performance.now() };
      for (;;) {
        const unread = await count('received');
        if (unread === 0) break;
        if (unread !== last.unread) last = { unread, at: performance.now() };
        else if (performance.now() - last.at > 60_000) throw new Error(`${unread} reports left unread for a minute`);
        await new Promise((r) => setTimeout(r, 20));
      }
      const processSeconds = (performance.now() - started) / 1000;
      if (profiler) await profiler.stopTo(process.env.BENCH_PROFILE!);
      const spent = {
        bench: cpuMsSince(before.bench),
        worker: (await cpuMsOf(worker.pid!)) - before.worker,
        postgres: (await cpuMsOfCommand('postgres')) - before.postgres,
        redis: (await cpuMsOfCommand('redis-server')) - before.redis,
      };
      await listener.close();
      const nowApplied = (await count('applied')) - applied;
      if (nowApplied !== COUNT) throw new Error(`round ${round}: applied ${nowApplied} of ${COUNT}`);

      const r = { discardRate: COUNT / discardSeconds, acceptRate: COUNT / acceptSeconds, processRate: COUNT / processSeconds, spent };
      rounds.push(r);
      console.log(
        `  round ${round}: discarding ${fmt(r.discardRate)} msg/s, stored ${fmt(r.acceptRate)} msg/s, read and applied ${fmt(r.processRate)} reports/s: ratio ${fmt(r.processRate / r.discardRate, 2)}`,
      );
      console.log(
        `    CPU a message discarded: client and listener ${perReport(discardCpuMs)}; a report stored and applied: client and listener ${perReport(spent.bench)}, worker ${perReport(spent.worker)}, PostgreSQL ${perReport(spent.postgres)}, Redis ${perReport(spent.redis)}`,
      );
    }
  } finally {
    await stop(worker);
  }
  const [bounced] = await em.execute<{ n: number }[]>(`select count(*)::int as n from emails where delivery_status = 'bounced'`, [], 'all');
  if (bounced!.n !== COUNT * ROUNDS) throw new Error(`bounced ${bounced!.n} of ${COUNT * ROUNDS}`);

  const ratios = rounds.map((r) => r.processRate / r.discardRate);
  console.log(`  discarding listener accepts   ${fmt(median(rounds.map((r) => r.discardRate)))} msg/s (median of the rounds)`);
  console.log(`  stored and enqueued (SMTP)     ${fmt(median(rounds.map((r) => r.acceptRate)))} msg/s`);
  console.log(`  reports read and applied       ${fmt(median(rounds.map((r) => r.processRate)))} reports/s`);
  console.log(`  ratio processed / discarded    ${fmt(median(ratios), 2)}, median of ${ratios.map((x) => fmt(x, 2)).join(', ')} (target >= 0.5, and >= 300/s on the quiet machine)`);
} finally {
  await bench.dispose();
}

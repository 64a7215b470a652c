// Bounces by mail: reports processed per second from DSNs delivered over 4 SMTP connections,
// against the rate at which the same listener accepts messages it discards.
//
//   npm run bench:inbound            (BENCH_INBOUND_COUNT=10000 by default)
//   BENCH_PROFILE=/tmp/inbound.cpuprofile npm run bench:inbound   (a CPU profile of the
//   client and listener while reports are stored, for Chrome's DevTools)
//
// Baseline: the listener (same SMTP server, same RCPT check of every return path) whose
// `accept` drops each message. Measured: the production path, each report stored in
// PostgreSQL, enqueued (reports stored within 100 ms share a job), read by a worker process
// (the report reader, the set-based outcome recorder in one transaction a job), timed from
// the first message until the last report is read.
import { readFileSync, writeFileSync } from 'node:fs';
import nodemailer from 'nodemailer';
import { loadavg } from 'node:os';
import { startInbound } from '../src/inbound/server.js';
import { smtpConnection } from '../src/shared/emails/transport.js';
import { cpuMsOf, cpuMsOfCommand, createBenchEnv, fmt, freePort, seedSentEmails, spawnService, stop } from './harness.js';

const COUNT = Number(process.env.BENCH_INBOUND_COUNT ?? 10_000);
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
  const ids = await seedSentEmails(bench, COUNT, '<p>Hello</p>');
  const template = readFileSync(new URL('../test/fixtures/bounces/postfix-dsn.eml', import.meta.url), 'utf8').replace(/\r?\n/g, '\r\n');
  const reports = ids.map((id, i) => {
    const returnPath = services.returnPaths.address(id, BOUNCE_DOMAIN);
    const raw = template
      .replaceAll('{{RETURN_PATH}}', returnPath)
      .replaceAll('{{RECIPIENT}}', `reader${i}@example.com`)
      .replaceAll('{{MESSAGE_ID}}', `${id}@bench.test`)
      .replaceAll('{{FROM}}', 'news@bench.test')
      .replaceAll('{{SUBJECT}}', 'Bench');
    return { returnPath, raw };
  });

  /** Delivers every report over CONNECTIONS pooled SMTP connections; seconds taken. */
  async function deliverAll(port: number): Promise<number> {
    // The service's own client options (TCP_NODELAY sockets: without them each message waits
    // ~40 ms for a delayed ACK, and both figures measure that instead).
    const client = nodemailer.createTransport({ ...smtpConnection(`smtp://127.0.0.1:${port}`), pool: true, maxConnections: CONNECTIONS, maxMessages: Infinity, ignoreTLS: true });
    const started = performance.now();
    await Promise.all(reports.map((r) => client.sendMail({ envelope: { from: '', to: [r.returnPath] }, raw: r.raw })));
    const seconds = (performance.now() - started) / 1000;
    client.close();
    return seconds;
  }

  const load = loadavg()[0]!;
  // Baseline: the listener discarding what it accepts.
  let discarded = 0;
  const discard = await startInbound(services, { port: 0, accept: async () => void discarded++ });
  const discardCpu = process.cpuUsage();
  const discardSeconds = await deliverAll(discard.port);
  const discardCpuMs = cpuMsSince(discardCpu);
  await discard.close();
  if (discarded !== COUNT) throw new Error(`the discarding listener accepted ${discarded} of ${COUNT}`);

  // The production path: stored and enqueued by the listener, read and applied by a worker
  // process of its own (the `worker` role, WORKER_QUEUES=inbound), as in production.
  const metricsPort = await freePort();
  const worker = await spawnService('src/workers/main.ts', { ...bench.env, WORKER_QUEUES: 'inbound', WORKER_METRICS_PORT: String(metricsPort) }, `http://127.0.0.1:${metricsPort}/readyz`);
  const listener = await startInbound(services, { port: 0 });
  const profiler = process.env.BENCH_PROFILE ? await startProfile() : undefined;
  const before = { bench: process.cpuUsage(), worker: await cpuMsOf(worker.pid!), postgres: await cpuMsOfCommand('postgres'), redis: await cpuMsOfCommand('redis-server') };
  const started = performance.now();
  const acceptSeconds = await deliverAll(listener.port);
  const em = services.orm.em.fork();
  let last = { unread: -1, at: performance.now() };
  for (;;) {
    const [row] = await em.execute<{ n: number }[]>(`select count(*)::int as n from inbound_reports where status = 'received'`, [], 'all');
    if (row!.n === 0) break;
    if (row!.n !== last.unread) last = { unread: row!.n, at: performance.now() };
    else if (performance.now() - last.at > 60_000) throw new Error(`${row!.n} reports left unread for a minute`);
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
  await stop(worker);

  const [applied] = await em.execute<{ n: number }[]>(`select count(*)::int as n from inbound_reports where status = 'applied'`, [], 'all');
  const [bounced] = await em.execute<{ n: number }[]>(`select count(*)::int as n from emails where delivery_status = 'bounced'`, [], 'all');
  if (applied!.n !== COUNT || bounced!.n !== COUNT) throw new Error(`applied ${applied!.n}, bounced ${bounced!.n} of ${COUNT}`);

  const discardRate = COUNT / discardSeconds;
  const processRate = COUNT / processSeconds;
  console.log(`inbound: ${fmt(COUNT)} DSNs over ${CONNECTIONS} SMTP connections (load average ${fmt(load, 1)})`);
  console.log(`  discarding listener accepts   ${fmt(discardRate)} msg/s`);
  console.log(`  stored and enqueued (SMTP)     ${fmt(COUNT / acceptSeconds)} msg/s`);
  console.log(`  reports read and applied       ${fmt(processRate)} reports/s`);
  const perReport = (ms: number) => `${fmt((ms * 1000) / COUNT)} us`;
  console.log(`  CPU a message, discarding: client and listener (one process) ${perReport(discardCpuMs)}`);
  console.log(`  CPU a report, stored and applied: client and listener ${perReport(spent.bench)}, worker ${perReport(spent.worker)}, PostgreSQL ${perReport(spent.postgres)}, Redis ${perReport(spent.redis)}`);
  console.log(`  ratio processed / discarded    ${fmt(processRate / discardRate, 2)} (target >= 0.5, and >= 300/s on the quiet machine)`);
} finally {
  await bench.dispose();
}

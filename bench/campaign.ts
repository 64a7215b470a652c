import type { ChildProcess } from 'node:child_process';
import nodemailer from 'nodemailer';
import { buildApp } from '../src/api/app.js';
import { renderCampaignTemplate } from '../src/shared/campaigns/content.js';
import { dkimOptionsFor } from '../src/shared/domains/dkim.js';
import { smtpConnection } from '../src/shared/emails/transport.js';
import { createSenderRow, seedSubscribers } from '../test/helpers/campaigns.js';
import { cpuMsOf, cpuMsOfCommand, createBenchEnv, fmt, rssOf, spawnService, startSinkProcess, stop } from './harness.js';

// `npm run bench:campaign`: N SUBSCRIBED subscribers (default 100,000), one campaign sent
// now, the smtp transport to a local sink (its own process). Measures the fan-out (all rows
// written and jobs enqueued), the time until the last message reaches the sink, the worker's
// peak RSS, the accept-to-provider time of a transactional send made mid-campaign, and the
// campaign's emails/s against nodemailer sending the same message straight to the sink.
const TOTAL = Number(process.env.BENCH_SUBSCRIBERS ?? 100_000);
const DIRECT = Math.min(TOTAL, 20_000);
const DIRECT_CONCURRENCY = 64;
const MAX_CONNECTIONS = 8;

const sink = await startSinkProcess();

const bench = await createBenchEnv('campaign', { MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url });
const app = await buildApp(bench.services);
await app.ready();
const auth = { authorization: `Bearer ${bench.token}` };
const CONTENT = `# Our November news

Hello **{{name}}**, here is what is new this month for {{email}}.

- Faster sending
- A new dashboard
- [Read the blog](https://acme.test/blog)

[Unsubscribe]({{unsubscribe_url}})`;

// BENCH_SEND_WORKERS=N: N hand-over processes sharing the SMTP connection count (16 / N each).
const SEND_WORKERS = Number(process.env.BENCH_SEND_WORKERS ?? 1);
let sendWorkers: ChildProcess[] = [];
let fanOutWorker: ChildProcess | undefined;
try {
  const em = bench.services.orm.em.fork();
  // Unsigned mail, like the direct baseline and bench:deliver (the sender's domain has no
  // DKIM key here); BENCH_DKIM=1 signs every message with a 2048-bit key instead.
  const senderId = await createSenderRow(bench.services, bench.organizationId, 'news@acme.test', 'Acme', process.env.BENCH_DKIM ? 'acme.test' : 'unsigned.acme.test');
  for (let done = 0; done < TOTAL; done += 50_000) await seedSubscribers(bench.services, bench.organizationId, Math.min(50_000, TOTAL - done), { domain: 'example.com', start: done });
  await em.execute('analyze subscribers');
  console.log(`seeded ${fmt(TOTAL)} subscribers`);

  // Two worker processes, as a deployment would scale them (WORKER_QUEUES): the fan-out
  // (`campaigns`) and the hand-over (`emails`, `campaign-emails`), so neither waits on the
  // other's event loop.
  fanOutWorker = await spawnService('src/workers/main.ts', { ...bench.env, WORKER_QUEUES: 'campaigns' });
  sendWorkers = await Promise.all(
    Array.from({ length: SEND_WORKERS }, () =>
      spawnService('src/workers/main.ts', { ...bench.env, WORKER_QUEUES: 'emails,campaign-emails', SMTP_MAX_CONNECTIONS: String(Math.max(1, Math.round(16 / SEND_WORKERS))) }),
    ),
  );
  const workersCpuMs = async () => (await Promise.all(sendWorkers.map((w) => cpuMsOf(w.pid!)))).reduce((a, b) => a + b, 0);
  let peakRss = 0;
  let fanOutPeakRss = 0;
  let fanOutDone = false;
  const rssTimer = setInterval(() => {
    for (const w of sendWorkers) void rssOf(w.pid!).then((rss) => (peakRss = Math.max(peakRss, rss)));
    void rssOf(fanOutWorker!.pid!).then((rss) => (fanOutPeakRss = Math.max(fanOutPeakRss, rss)));
  }, 100);
  await new Promise((r) => setTimeout(r, 3_000)); // worker start-up

  const created = await app.inject({ method: 'POST', url: '/api/v2/campaigns', headers: auth, payload: { name: 'Bench', subject: 'News for {{name}}', senderId, content: CONTENT } });
  const campaignId = created.json().id as string;
  const cpuBefore = { worker: await workersCpuMs(), postgres: await cpuMsOfCommand('postgres'), sink: await cpuMsOf(sink.proc.pid!) };
  const started = Date.now();
  const sent = await app.inject({ method: 'POST', url: `/api/v2/campaigns/${campaignId}/send`, headers: auth, payload: {} });
  if (sent.statusCode !== 200) throw new Error(sent.body);

  let fanOutMs = 0;
  let transactional: { id: string; at: number; sentCount: number } | undefined;
  let lastMs = 0;
  for (;;) {
    const [c] = await em.execute<{ fanout_done: boolean; emails_sent_count: number; status: string }[]>(
      'select fanout_done, emails_sent_count, status from campaigns where id = ?',
      [campaignId],
    );
    if (!fanOutDone && c!.fanout_done) {
      fanOutDone = true;
      fanOutMs = Date.now() - started;
    }
    // The transactional send, once a fifth of the campaign is out (the queue is then full).
    if (!transactional && c!.emails_sent_count >= TOTAL / 5) {
      const res = await app.inject({
        method: 'POST',
        url: '/api/v2/emails',
        headers: auth,
        payload: { from: 'Acme <receipts@acme.test>', to: 'buyer@example.org', subject: 'Your receipt', markdown: 'Receipt **#1**' },
      });
      transactional = { id: res.json().id, at: Date.now(), sentCount: c!.emails_sent_count };
    }
    const received = await sink.count();
    if (received >= TOTAL + (transactional ? 1 : 0) && fanOutDone) {
      lastMs = Date.now() - started;
      break;
    }
    if (Date.now() - started > 600_000) throw new Error(`not finished in 10 minutes (sink ${received})`);
    await new Promise((r) => setTimeout(r, 50));
  }
  clearInterval(rssTimer);
  // CPU of the send worker (its signing threads included), PostgreSQL and the sink, an email.
  const cpuPerEmail = {
    worker: ((await workersCpuMs()) - cpuBefore.worker) / TOTAL,
    postgres: ((await cpuMsOfCommand('postgres')) - cpuBefore.postgres) / TOTAL,
    sink: ((await cpuMsOf(sink.proc.pid!)) - cpuBefore.sink) / TOTAL,
  };
  const [tx] = await em.execute<{ created_at: Date; sent_at: Date }[]>('select created_at, sent_at from emails where id = ?', [transactional!.id]);
  const txMs = new Date(tx!.sent_at).getTime() - new Date(tx!.created_at).getTime();
  const [span] = await em.execute<{ first: Date; last: Date }[]>(`select min(claimed_at) as first, max(sent_at) as last from emails where campaign_id = ?`, [campaignId]);
  const sendSeconds = (new Date(span!.last).getTime() - new Date(span!.first).getTime()) / 1000;
  const campaignRate = TOTAL / sendSeconds;
  await Promise.all(sendWorkers.map((w) => stop(w)));
  await stop(fanOutWorker);
  sendWorkers = [];
  fanOutWorker = undefined;

  // Baseline: nodemailer straight to the same sink, the same message pre-rendered.
  const template = renderCampaignTemplate({ contentType: 'MARKDOWN', content: CONTENT, subject: 'News for {{name}}', preview: null });
  // With BENCH_DKIM, the baseline signs with the same key (nodemailer, single-threaded).
  const dkim = process.env.BENCH_DKIM ? ((await dkimOptionsFor(() => em.fork(), bench.services.box, bench.organizationId, 'acme.test', bench.services.dkimKeys)) ?? undefined) : undefined;
  const transport = nodemailer.createTransport({ ...smtpConnection(sink.url), pool: true, maxConnections: MAX_CONNECTIONS, maxMessages: Infinity, dkim });
  let next = 0;
  const directCpu = process.cpuUsage();
  const directStarted = Date.now();
  await Promise.all(
    Array.from({ length: DIRECT_CONCURRENCY }, async () => {
      while (next < DIRECT) {
        const i = next++;
        await transport.sendMail({ from: 'news@acme.test', to: `user${i}@example.com`, subject: 'News', html: template.html, text: template.text, messageId: `<direct${i}@acme.test>` });
      }
    }),
  );
  const directRate = DIRECT / ((Date.now() - directStarted) / 1000);
  const directUsage = process.cpuUsage(directCpu);
  transport.close();

  console.log('');
  console.log(`audience: ${fmt(TOTAL)} SUBSCRIBED subscribers, one MARKDOWN campaign sent now`);
  console.log(`fan-out (all email rows written, send jobs enqueued): ${fmt(fanOutMs / 1000, 2)} s (target <= 10 s)`);
  console.log(`last message at the sink: ${fmt(lastMs / 1000, 2)} s after the send call (target <= 120 s)`);
  console.log(`transactional send made with ${fmt(transactional!.sentCount)} campaign emails out: accepted -> handed to the provider in ${fmt(txMs)} ms`);
  console.log(`peak RSS: fan-out worker ${fmt(fanOutPeakRss / 1024 / 1024)} MiB, send worker ${fmt(peakRss / 1024 / 1024)} MiB (target <= 300)`);
  console.log(`campaign hand-over: ${fmt(campaignRate)} emails/s; direct nodemailer (${fmt(DIRECT)} pre-rendered, pool of ${MAX_CONNECTIONS}): ${fmt(directRate)} emails/s`);
  console.log(`CPU an email: send worker ${fmt(cpuPerEmail.worker, 3)} ms, PostgreSQL ${fmt(cpuPerEmail.postgres, 3)} ms, sink ${fmt(cpuPerEmail.sink, 3)} ms (fan-out included)`);
  console.log(`direct nodemailer CPU: ${fmt((directUsage.user + directUsage.system) / 1000 / DIRECT, 3)} ms an email${dkim ? ' (DKIM-signed)' : ''}`);
  console.log(`ratio campaign / direct: ${fmt(campaignRate / directRate, 2)}`);
} finally {
  await Promise.all(sendWorkers.map((w) => stop(w)));
  if (fanOutWorker) await stop(fanOutWorker);
  sink.stop();
  await app.close();
  await bench.dispose();
}

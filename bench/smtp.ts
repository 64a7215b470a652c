import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import { loadavg } from 'node:os';
import nodemailer from 'nodemailer';
import { createBenchEnv, fmt, freePort, spawnService, stop, startSinkProcess } from './harness.js';

// `npm run bench:smtp`: messages accepted a second by the SMTP submission listener (its own
// process, Procfile role `smtp`) from nodemailer's pooled client over 8 connections, each
// with a 20 KB HTML body and a 100 KB attachment, against the same client sending to a
// bare smtp-server that discards the message (its own process too), in the same run. Then
// a worker process delivers what was accepted to that server: the end-to-end rate.
const TOTAL = Number(process.env.BENCH_MESSAGES ?? 1_000);
const CONNECTIONS = 8;
const CONCURRENCY = 32;

const sink = await startSinkProcess();

const port = await freePort();
const bench = await createBenchEnv('smtp', {
  MAIL_TRANSPORT: 'smtp',
  SMTP_URL: sink.url,
  WORKER_QUEUES: 'emails',
  // Plain-text AUTH on loopback, as in development; TLS would cost both sides the same.
  NODE_ENV: 'development',
  SMTP_SUBMISSION_PORT: String(port),
});

const html = `<html><body>${'<p>Thank you for your order. Here is everything about it, line by line.</p>\n'.repeat(270)}</body></html>`.slice(0, 20_000);
const attachment = randomBytes(100 * 1024);

async function waitForPort(p: number): Promise<void> {
  const started = Date.now();
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect(p, '127.0.0.1');
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (open) return;
    if (Date.now() - started > 30_000) throw new Error(`nothing listens on ${p}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function run(target: { port: number; auth?: { user: string; pass: string } }, label: string, total = TOTAL): Promise<number> {
  const transport = nodemailer.createTransport({ host: '127.0.0.1', port: target.port, secure: false, ignoreTLS: true, pool: true, maxConnections: CONNECTIONS, maxMessages: Infinity, auth: target.auth });
  let next = 0;
  const t0 = Date.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < total) {
        const i = next++;
        await transport.sendMail({
          from: 'Acme Billing <billing@acme.test>',
          to: `customer${i}@example.com`,
          subject: `Invoice ${i}`,
          html,
          text: 'Your invoice is attached.',
          attachments: [{ filename: 'invoice.pdf', content: attachment, contentType: 'application/pdf' }],
        });
      }
    }),
  );
  const rate = total / ((Date.now() - t0) / 1000);
  transport.close();
  console.log(`${label}: ${fmt(total)} messages in ${fmt((Date.now() - t0) / 1000, 1)} s, ${fmt(rate)} messages/s`);
  return rate;
}

let listener: ChildProcess | undefined;
let worker: ChildProcess | undefined;
try {
  console.log(`load average at start: ${loadavg().map((l) => l.toFixed(1)).join(' ')}`);
  const sinkPort = Number(new URL(sink.url).port);
  const bare = [await run({ port: sinkPort }, 'bare smtp-server (discards)')];

  listener = await spawnService('src/smtp/main.ts', bench.env);
  await waitForPort(port);
  const auth = { user: 'bench', pass: bench.token };
  const WARM_UP = 100;
  await run({ port, auth }, 'warm-up of the listener (not counted)', WARM_UP);
  const accepted = [await run({ port, auth }, 'mailroom SMTP submission (stored, committed)')];
  bare.push(await run({ port: sinkPort }, 'bare smtp-server again'));
  const bareRate = bare.reduce((a, b) => a + b, 0) / bare.length;
  const acceptedRate = accepted[0]!;

  // End to end: a worker process delivers the accepted messages to the sink.
  const before = await sink.count();
  const t0 = Date.now();
  worker = await spawnService('src/workers/main.ts', bench.env);
  for (;;) {
    if ((await sink.count()) - before >= TOTAL + WARM_UP) break;
    if (Date.now() - t0 > 300_000) throw new Error('the worker did not deliver everything in 5 minutes');
    await new Promise((r) => setTimeout(r, 100));
  }
  const deliveredRate = (TOTAL + WARM_UP) / ((Date.now() - t0) / 1000);
  const [row] = await bench.services.orm.em.fork().execute<{ sent: string; attachments: string }[]>(
    `select (select count(*) from emails where status = 'sent') as sent, (select count(*) from email_attachments) as attachments`,
  );
  console.log(`worker: delivered ${fmt(TOTAL + WARM_UP)} to the sink in ${fmt((Date.now() - t0) / 1000, 1)} s (worker start included), ${fmt(deliveredRate)} messages/s; ${row!.sent} sent, ${row!.attachments} attachments stored`);
  console.log('');
  console.log(`accepted ${fmt(acceptedRate)} messages/s vs bare smtp-server ${fmt(bareRate)} messages/s: ratio ${(acceptedRate / bareRate).toFixed(2)} (target >= 0.5, and >= 300/s on a quiet machine)`);
  console.log(`load average at end: ${loadavg().map((l) => l.toFixed(1)).join(' ')}`);
} finally {
  if (worker) await stop(worker);
  if (listener) await stop(listener);
  sink.stop();
  await bench.dispose();
}

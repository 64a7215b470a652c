import type { ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { Agent, request } from 'undici';
import { newEmailFromBody, SendEmailBody } from '../src/shared/emails/input.js';
import { insertEmails, sendJob } from '../src/shared/emails/service.js';
import { createOrganization } from '../src/shared/organizations/service.js';
import { recordEmailEvents } from '../src/shared/webhooks/queries.js';
import { createWebhook } from '../src/shared/webhooks/service.js';
import { webhookHeaders } from '../src/shared/webhooks/signer.js';
import { cpuMsOf, createBenchEnv, fmt, spawnService, startHelperProcess, startSinkProcess, stop } from './harness.js';

// `npm run bench:webhooks`, three parts:
// 1. a burst of EVENTS email events to 2 endpoints of a local receiver that answers 200 at
//    once, delivered by one worker process, against raw undici POSTs of the same bodies from
//    this process (target >= 0.5 of raw, and >= 1,000 deliveries/s on a quiet machine);
// 2. the same with a third endpoint that answers after 10 s: the other two keep >= 0.8 of
//    their rate;
// 3. the outbox on the send path: SEND_EMAILS emails through a worker to an SMTP sink for an
//    organization with one endpoint subscribed to email.sent, against one with none, in
//    alternating runs (target >= 0.85).
const EVENTS = Number(process.env.BENCH_EVENTS ?? 20_000);
const SEND_EMAILS = Number(process.env.BENCH_SEND_EMAILS ?? 5_000);
const SEND_RUNS = Number(process.env.BENCH_SEND_RUNS ?? 2);
// BENCH_PARTS=3 runs only the send-path part, BENCH_PARTS=1,2 only the delivery parts.
const PARTS = new Set((process.env.BENCH_PARTS ?? '1,2,3').split(',').map((p) => Number(p.trim())));

const receiver = await startHelperProcess('./webhook-receiver-process.ts');
const sink = await startSinkProcess();

const bench = await createBenchEnv('webhooks', { WEBHOOK_ALLOW_PRIVATE_URLS: 'true', MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url });
const em = bench.services.orm.em.fork();
const deps = { em, box: bench.services.box, dns: bench.services.dns, allowPrivateUrls: true };
const body = SendEmailBody.parse({ from: 'Acme <receipts@acme.test>', to: 'user@example.com', subject: 'Your receipt', markdown: '# Thanks\n\nYour receipt **#1234** is ready.' });
const load = async () => (await readFile('/proc/loadavg', 'utf8')).split(' ').slice(0, 3).join(' ');

async function seedEmails(organizationId: string, count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let done = 0; done < count; done += 1000) {
    const inputs = Array.from({ length: Math.min(1000, count - done) }, (_, i) => ({ ...newEmailFromBody(organizationId, body), to: `user${done + i}@example.com` }));
    ids.push(...(await insertEmails(em, inputs)));
  }
  return ids;
}

async function seedEvents(ids: string[]): Promise<void> {
  for (let i = 0; i < ids.length; i += 1000) {
    await em.transactional(async (tx) => recordEmailEvents(tx, 'email.sent', ids.slice(i, i + 1000).map((emailId) => ({ emailId }))));
  }
}

/** Deliveries per second of these endpoints, from their first success to their last. */
async function deliveredRate(endpointIds: string[], expected: number): Promise<{ rate: number; seconds: number }> {
  const started = Date.now();
  for (;;) {
    const [row] = await em.execute<{ n: number }[]>(`select count(*)::int as n from webhook_messages where status = 'succeeded' and endpoint_id = any(array(select jsonb_array_elements_text(?::jsonb)))`, [JSON.stringify(endpointIds)]);
    if (row!.n >= expected) break;
    if (Date.now() - started > 600_000) throw new Error(`only ${row!.n} of ${expected} delivered in 10 minutes`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const [span] = await em.execute<{ first: Date; last: Date }[]>(
    `select min(updated_at) as first, max(updated_at) as last from webhook_messages where status = 'succeeded' and endpoint_id = any(array(select jsonb_array_elements_text(?::jsonb)))`,
    [JSON.stringify(endpointIds)],
  );
  const seconds = (new Date(span!.last).getTime() - new Date(span!.first).getTime()) / 1000;
  return { rate: expected / seconds, seconds };
}

/** The same number of signed POSTs straight from this process, as many in flight as the worker allows. */
async function raw(paths: string[], perPath: number): Promise<number> {
  const agent = new Agent({ connections: 16, keepAliveTimeout: 4_000 });
  const [sample] = await em.execute<{ id: string; payload: unknown }[]>('select id, payload from webhook_messages limit 1');
  const text = JSON.stringify(sample!.payload);
  const t0 = Date.now();
  await Promise.all(
    paths.map(async (path) => {
      let next = 0;
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          while (next < perPath) {
            next++;
            const res = await request(`${receiver.url}${path}`, { dispatcher: agent, method: 'POST', body: text, headers: { ...webhookHeaders('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', sample!.id, text, new Date()), 'content-type': 'application/json' } });
            await res.body.dump();
          }
        }),
      );
    }),
  );
  const rate = (paths.length * perPath) / ((Date.now() - t0) / 1000);
  await agent.close();
  return rate;
}

let worker: ChildProcess | undefined;
try {
  // ---- 1. Two endpoints answering at once.
  if (PARTS.has(1) || PARTS.has(2)) {
  const a = await createWebhook(deps, bench.organizationId, { url: `${receiver.url}/a`, events: ['email.sent'] });
  const b = await createWebhook(deps, bench.organizationId, { url: `${receiver.url}/b`, events: ['email.sent'] });
  const ids = await seedEmails(bench.organizationId, EVENTS);
  // Only their events are measured here: the emails themselves are never sent.
  await em.execute(`update emails set status = 'failed', failure_reason = 'bench'`);
  const t0 = Date.now();
  await seedEvents(ids);
  console.log(`seeded ${fmt(EVENTS)} email events x 2 endpoints = ${fmt(2 * EVENTS)} outbox rows in ${fmt((Date.now() - t0) / 1000, 1)} s (load ${await load()})`);
  const rawBefore = await raw(['/raw-a', '/raw-b'], EVENTS / 4);
  worker = await spawnService('src/workers/main.ts', { ...bench.env, WORKER_QUEUES: 'webhooks' });
  const two = await deliveredRate([a.id, b.id], 2 * EVENTS);
  await stop(worker);
  worker = undefined;
  const rawAfter = await raw(['/raw-a', '/raw-b'], EVENTS / 4);
  const rawRate = (rawBefore + rawAfter) / 2;
  console.log(`1. worker: ${fmt(2 * EVENTS)} deliveries in ${fmt(two.seconds, 2)} s = ${fmt(two.rate)}/s; raw undici: ${fmt(rawRate)}/s (runs ${fmt(rawBefore)}, ${fmt(rawAfter)})`);
  console.log(`   ratio worker / raw: ${fmt(two.rate / rawRate, 2)} (target >= 0.5; >= 1,000/s on a quiet machine) (load ${await load()})`);

  // ---- 2. A third endpoint that takes 10 s an answer.
  await em.execute('delete from webhook_messages');
  const slow = await createWebhook(deps, bench.organizationId, { url: `${receiver.url}/slow`, events: ['email.sent'] });
  await seedEvents(ids);
  worker = await spawnService('src/workers/main.ts', { ...bench.env, WORKER_QUEUES: 'webhooks' });
  const withSlow = await deliveredRate([a.id, b.id], 2 * EVENTS);
  const [slowDone] = await em.execute<{ n: number }[]>(`select count(*)::int as n from webhook_messages where endpoint_id = ? and status = 'succeeded'`, [slow.id]);
  worker.kill('SIGKILL');
  worker = undefined;
  console.log(`2. with a 10 s endpoint: the other two ${fmt(withSlow.rate)}/s = ${fmt(withSlow.rate / two.rate, 2)} of their rate alone (target >= 0.8); the slow one had ${fmt(slowDone!.n)} recorded delivered meanwhile (load ${await load()})`);
  await em.execute('delete from webhook_endpoints');
  }

  // ---- 3. The outbox on the send path (BENCH_SEND_RUNS=0 skips it).
  if (SEND_RUNS > 0 && PARTS.has(3)) {
  const plain = await createOrganization(em, bench.services.box, { name: 'Plain', verifyQuota: 10 });
  const hooked = await createOrganization(em, bench.services.box, { name: 'Hooked', verifyQuota: 10 });
  await createWebhook(deps, hooked.organization.id, { url: `${receiver.url}/sent`, events: ['email.sent'] });
  const sendRun = async (organizationId: string) => {
    const ids = await seedEmails(organizationId, SEND_EMAILS);
    await bench.services.producer.addBulk('emails', ids.map(sendJob));
    const w = await spawnService('src/workers/main.ts', { ...bench.env, WORKER_QUEUES: 'emails' });
    // CPU spent by the worker and by the PostgreSQL backends of this database while the
    // emails go out (from the first one sent): on a loaded machine a steadier measure than
    // the rate, which follows whatever else runs.
    let cpuAtFirst: number | undefined;
    let doneAtFirst = 0;
    let cpuMs: number;
    try {
      const started = Date.now();
      for (;;) {
        const [row] = await em.execute<{ n: number }[]>(`select count(*)::int as n from emails where id = any(array(select jsonb_array_elements_text(?::jsonb))) and status in ('sent', 'failed')`, [JSON.stringify(ids)]);
        if (cpuAtFirst === undefined && row!.n > 0) {
          cpuAtFirst = await cpuMsOf(w.pid!);
          doneAtFirst = row!.n;
        }
        if (row!.n >= SEND_EMAILS) break;
        if (Date.now() - started > 600_000) throw new Error('send run did not finish in 10 minutes');
        await new Promise((r) => setTimeout(r, 200));
      }
      cpuMs = ((await cpuMsOf(w.pid!)) - cpuAtFirst!) / Math.max(1, SEND_EMAILS - doneAtFirst);
    } finally {
      await stop(w);
    }
    const [span] = await em.execute<{ first: Date; last: Date }[]>(`select min(claimed_at) as first, max(sent_at) as last from emails where id = any(array(select jsonb_array_elements_text(?::jsonb)))`, [JSON.stringify(ids)]);
    return { rate: SEND_EMAILS / ((new Date(span!.last).getTime() - new Date(span!.first).getTime()) / 1000), cpuMs };
  };
  const none: { rate: number; cpuMs: number }[] = [];
  const one: { rate: number; cpuMs: number }[] = [];
  for (let run = 0; run < SEND_RUNS; run++) {
    none.push(await sendRun(plain.organization.id));
    one.push(await sendRun(hooked.organization.id));
  }
  const [outbox] = await em.execute<{ n: number }[]>(`select count(*)::int as n from webhook_messages where organization_id = ?`, [hooked.organization.id]);
  const avg = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
  const rates = (runs: { rate: number }[]) => runs.map((r) => fmt(r.rate)).join(', ');
  const cpus = (runs: { cpuMs: number }[]) => runs.map((r) => fmt(r.cpuMs, 3)).join(', ');
  console.log(`3. send path: no endpoint ${rates(none)} emails/s, worker CPU ${cpus(none)} ms an email; one endpoint on email.sent ${rates(one)} emails/s, ${cpus(one)} ms an email (${fmt(outbox!.n)} outbox rows)`);
  console.log(`   rate with / without: ${fmt(avg(one.map((r) => r.rate)) / avg(none.map((r) => r.rate)), 2)}; worker CPU an email without / with: ${fmt(avg(none.map((r) => r.cpuMs)) / avg(one.map((r) => r.cpuMs)), 2)} (target >= 0.85) (load ${await load()})`);
  }
} finally {
  if (worker) await stop(worker);
  receiver.stop();
  sink.stop();
  await bench.dispose();
}

import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UNCERTAIN_REASON } from '../src/shared/emails/deliver.js';
import { createSenderRow, seedSubscribers } from './helpers/campaigns.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startCountingSink, type CountingSink } from './helpers/counting-sink.js';
import { nodeArgs, ROOT } from './helpers/process.js';

// docs/operations.md, "Killing a process": the worker's process group is SIGKILLed at random
// moments while it hands a batch and a campaign to a relay answering in 2 ms, then in 20 ms,
// and restarted at once. Nothing is sent twice, nothing that was not handed over is lost,
// nothing the relay accepted reads anything but `sent`, only emails whose final `.` was
// written without an answer read (at most one per SMTP connection) are failed as uncertain,
// no email stays `sending`, and the campaign's counter is exact.
const TRANSACTIONAL = 500; // 5 batches of 100
const AUDIENCE = 300;
const KILLS = 2;
const SMTP_CONNECTIONS = 16; // the transport's pool (transport.ts)

let ctx: TestContext;
const sinks: CountingSink[] = [];
const workers = new Set<ChildProcess>();

beforeAll(async () => {
  ctx = await createTestContext({ LOG_LEVEL: 'warn' });
});
afterAll(async () => {
  for (const w of workers) killGroup(w);
  await ctx?.close();
  for (const s of sinks) await s.close();
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A worker process in a process group of its own, like a container or a systemd unit. */
function startWorker(smtpUrl: string): ChildProcess {
  const child = spawn(process.execPath, nodeArgs('src/workers/main.ts'), {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...ctx.env.env, MAIL_TRANSPORT: 'smtp', SMTP_URL: smtpUrl, LOG_LEVEL: 'warn' },
    stdio: 'ignore',
    detached: true,
  });
  workers.add(child);
  child.once('exit', () => workers.delete(child));
  return child;
}

function killGroup(child: ChildProcess): void {
  try {
    process.kill(-child.pid!, 'SIGKILL');
  } catch {
    // already gone
  }
}

async function sql<T>(query: string, params: unknown[] = []): Promise<T[]> {
  return ctx.services.orm.em.fork().execute(query, params, 'all') as Promise<T[]>;
}

describe.each([2, 20])('worker SIGKILLed mid-send, relay answering in %i ms', (replyDelayMs) => {
  it(`loses nothing and sends nothing twice over ${KILLS} kills`, { timeout: 120_000 }, async () => {
    const sink = await startCountingSink({ replyDelayMs });
    sinks.push(sink);
    const { token, organizationId } = await createOrg(ctx.services);
    const domain = `bulk${replyDelayMs}.test`;
    const senderId = await createSenderRow(ctx.services, organizationId, `news@${domain}`);
    await seedSubscribers(ctx.services, organizationId, AUDIENCE, { domain: 'example.net', start: replyDelayMs * 10_000 });

    // Accepted before any worker runs: a backlog the worker is busy with when killed.
    for (let b = 0; b < TRANSACTIONAL / 100; b++) {
      const res = await ctx.app.inject({
        method: 'POST',
        url: '/api/v2/emails/batch',
        headers: bearer(token),
        payload: Array.from({ length: 100 }, (_, i) => ({ from: `Acme <receipts@${domain}>`, to: `user${b * 100 + i}@example.com`, subject: 'Receipt', html: `<p>Receipt ${i}</p>` })),
      });
      expect(res.statusCode).toBe(200);
    }
    const created = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/campaigns',
      headers: bearer(token),
      payload: { name: 'Kill', subject: 'Hi {{name}}', senderId, content: 'Hello {{email}}\n\n[Unsubscribe]({{unsubscribe_url}})' },
    });
    const campaignId = created.json().id as string;
    expect((await ctx.app.inject({ method: 'POST', url: `/api/v2/campaigns/${campaignId}/send`, headers: bearer(token), payload: {} })).statusCode).toBe(200);

    const total = TRANSACTIONAL + AUDIENCE;
    let worker = startWorker(sink.url);
    const kills: { atSink: number; sending: number }[] = [];
    for (let k = 0; k < KILLS; k++) {
      // A random moment while the worker hands mail over.
      const target = sink.accepted + 30 + Math.floor(Math.random() * (total / (KILLS + 1) - 30));
      for (const started = Date.now(); sink.accepted < target && Date.now() - started < 30_000; ) await sleep(2);
      await sleep(Math.random() * 20);
      killGroup(worker);
      await new Promise((resolve) => (worker.exitCode !== null || worker.signalCode !== null ? resolve(undefined) : worker.once('exit', resolve)));
      const [row] = await sql<{ n: number }>(`select count(*)::int as n from emails where organization_id = ? and status = 'sending'`, [organizationId]);
      kills.push({ atSink: sink.accepted, sending: row!.n });
      worker = startWorker(sink.url);
    }
    const restarted = Date.now();

    // Every email settles (sent, or failed as uncertain) within 60 s of the last restart.
    let pending: number;
    for (;;) {
      const [row] = await sql<{ n: number }>(`select count(*)::int as n from emails where organization_id = ? and status in ('queued', 'sending')`, [organizationId]);
      pending = row!.n;
      const [written] = await sql<{ n: number }>(`select count(*)::int as n from emails where organization_id = ?`, [organizationId]);
      if (pending === 0 && written!.n === total) break;
      if (Date.now() - restarted > 60_000) break;
      await sleep(200);
    }
    await sleep(300); // anything sent twice would have arrived by now
    killGroup(worker);
    expect(pending).toBe(0);

    const rows = await sql<{ id: string; status: string; failure_reason: string | null; from_address: string }>(
      `select id, status, failure_reason, from_address from emails where organization_id = ?`,
      [organizationId],
    );
    expect(rows).toHaveLength(total);
    const received = (id: string) => sink.received.get(`${id}@${domain}`) ?? 0;
    const duplicates = [...sink.received.values()].filter((n) => n > 1).length;
    const uncertain = rows.filter((r) => r.status === 'failed' && r.failure_reason === UNCERTAIN_REASON);
    // Lost: not sent and not one of the uncertain (a message never handed over must be sent).
    const lost = rows.filter((r) => r.status !== 'sent' && r.failure_reason !== UNCERTAIN_REASON);
    // Accepted by the relay, recorded as anything but sent (outside the uncertain window).
    const acceptedNotSent = rows.filter((r) => received(r.id) > 0 && r.status !== 'sent' && r.failure_reason !== UNCERTAIN_REASON);
    const sentNotReceived = rows.filter((r) => r.status === 'sent' && received(r.id) === 0);
    const [campaign] = await sql<{ counted: number; sent: number }>(
      `select c.emails_sent_count as counted, (select count(*)::int from emails e where e.campaign_id = c.id and e.status = 'sent') as sent from campaigns c where c.id = ?`,
      [campaignId],
    );
    const report = { replyDelayMs, kills, duplicates, lost: lost.length, acceptedNotSent: acceptedNotSent.length, sentNotReceived: sentNotReceived.length, uncertain: uncertain.length, uncertainAtSink: uncertain.filter((r) => received(r.id) > 0).length, campaign, settledInMs: Date.now() - restarted };
    console.log(JSON.stringify(report));

    expect(duplicates).toBe(0);
    expect(lost.map((r) => `${r.id} ${r.status} ${r.failure_reason}`)).toEqual([]);
    expect(acceptedNotSent).toHaveLength(0);
    expect(sentNotReceived).toHaveLength(0);
    expect(uncertain.length).toBeLessThanOrEqual(KILLS * SMTP_CONNECTIONS);
    expect(campaign!.counted).toBe(campaign!.sent);
  });
});

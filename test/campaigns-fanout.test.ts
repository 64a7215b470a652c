import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { campaignEmailsProcessor } from '../src/workers/campaigns.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { createSenderRow, seedSubscribers } from './helpers/campaigns.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { runService, type ServiceProcess } from './helpers/process.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';

/**
 * docs/campaigns.md "Fan-out": a fan-out worker killed (SIGKILL) in the middle of a campaign is
 * replaced, and each subscriber still receives exactly one email. The fan-out runs in child
 * processes (the `campaigns` queue only); the hand-over to SMTP runs in this process.
 */
const AUDIENCE = 2_000;

let ctx: TestContext;
let sink: SmtpSink;
let senders: RunningWorkers;
const children: ServiceProcess[] = [];
const received = new Map<string, number>();

beforeAll(async () => {
  sink = await startSmtpSink({ parse: false });
  sink.answer = (rcpt) => {
    received.set(rcpt, (received.get(rcpt) ?? 0) + 1);
    return undefined;
  };
  ctx = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, CAMPAIGN_FANOUT_PAGE: '50' });
  senders = await startWorkers(ctx.services, createRedis(ctx.env.config.redisUrl, 'worker'), [campaignEmailsProcessor] as never);
});
afterAll(async () => {
  for (const c of children) c.kill();
  await senders?.close();
  await ctx?.close();
  await sink?.close();
});

function fanOutWorker(): ServiceProcess {
  const child = runService('src/workers/main.ts', [], { ...ctx.env.env, WORKER_QUEUES: 'campaigns', LOG_LEVEL: 'info' });
  children.push(child);
  return child;
}

async function sql<T>(query: string, params: unknown[] = []): Promise<T[]> {
  return ctx.services.orm.em.fork().execute(query, params, 'all') as Promise<T[]>;
}

describe('fan-out with a worker killed in the middle', () => {
  it(`delivers exactly one email to each of ${AUDIENCE} subscribers`, { timeout: 90_000 }, async () => {
    const { token, organizationId } = await createOrg(ctx.services);
    const senderId = await createSenderRow(ctx.services, organizationId, 'news@bulk.test');
    await seedSubscribers(ctx.services, organizationId, AUDIENCE, { domain: 'bulk.test' });

    const first = fanOutWorker();
    await first.waitFor(/workers started/);
    const created = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/campaigns',
      headers: bearer(token),
      payload: { name: 'Bulk', subject: 'Hi {{name}}', senderId, content: 'Hello {{email}}\n\n[Unsubscribe]({{unsubscribe_url}})' },
    });
    const id = created.json().id as string;
    const sent = await ctx.app.inject({ method: 'POST', url: `/api/v2/campaigns/${id}/send`, headers: bearer(token), payload: {} });
    expect(sent.json()).toMatchObject({ status: 'SCHEDULED', recipientCount: AUDIENCE });

    // Kill the worker once some pages, but not all, are committed.
    let written: number;
    for (;;) {
      const [row] = await sql<{ n: number }>(`select count(*)::int as n from emails where campaign_id = ?`, [id]);
      written = row!.n;
      if (written > 0) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    first.child.kill('SIGKILL');
    expect(await first.exited).toBe('SIGKILL');
    const [atKill] = await sql<{ n: number; done: boolean }>(
      `select (select count(*)::int from emails where campaign_id = c.id) as n, c.fanout_done as done from campaigns c where c.id = ?`,
      [id],
    );
    expect(atKill!.done).toBe(false);
    expect(atKill!.n).toBeLessThan(AUDIENCE);

    const second = fanOutWorker();
    await second.waitFor(/workers started/);
    const end = Date.now() + 75_000;
    let status = '';
    while (Date.now() < end) {
      [{ status }] = (await sql<{ status: string }>('select status from campaigns where id = ?', [id])) as [{ status: string }];
      if (status === 'SENT' || status === 'FAILED') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(status).toBe('SENT');
    const [counts] = await sql<{ rows: number; subs: number; sent: number; count: number }>(
      `select count(*)::int as rows, count(distinct subscriber_id)::int as subs, count(*) filter (where status = 'sent')::int as sent,
              (select emails_sent_count from campaigns where id = ?) as count
       from emails where campaign_id = ?`,
      [id, id],
    );
    expect(counts).toEqual({ rows: AUDIENCE, subs: AUDIENCE, sent: AUDIENCE, count: AUDIENCE });
    expect(received.size).toBe(AUDIENCE);
    expect([...received.values()].every((n) => n === 1)).toBe(true);
    expect(sink.accepted).toBe(AUDIENCE);
  });
});

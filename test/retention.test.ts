import { ulid } from 'ulid';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { idBefore, PURGE_TARGETS, purgeExpired } from '../src/shared/retention/purge.js';
import { maintenanceProcessor } from '../src/workers/maintenance.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';

const DAY = 86_400_000;
let ctx: TestContext;
let organizationId: string;

beforeAll(async () => {
  ctx = await createTestContext({ EMAIL_RETENTION_DAYS: '30' });
  ({ organizationId } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

const sql = <T = Record<string, unknown>>(text: string, params: unknown[] = []) => ctx.services.orm.em.fork().execute<T[]>(text, params);

/** An email (with an open and a delivered event) created `ageDays` ago, its id of that time too. */
async function email(ageDays: number, status = 'sent'): Promise<string> {
  const at = new Date(Date.now() - ageDays * DAY);
  const id = `eml_${ulid(at.getTime()).toLowerCase()}`;
  await sql(
    `insert into emails (id, organization_id, status, from_address, to_address, subject, content_kind, content, created_at, updated_at)
     values (?, ?, ?, 'a@sender.example', 'b@example.com', 'Old', 'html', '<p>x</p>', ?, ?)`,
    [id, organizationId, status, at, at],
  );
  await sql(`insert into email_events (email_id, organization_id, type, occurred_at) values (?, ?, 'delivered', ?), (?, ?, 'open', ?)`, [
    id, organizationId, at, id, organizationId, at,
  ]);
  return id;
}

async function verification(ageDays: number): Promise<string> {
  const at = new Date(Date.now() - ageDays * DAY);
  const id = `ver_${ulid(at.getTime()).toLowerCase()}`;
  await sql(
    `insert into email_verifications (id, organization_id, email, result, accept, status, traits, issues, cache_hit, created_at)
     values (?, ?, 'x@example.com', 'deliverable', true, 'completed', '{}', '[]', false, ?)`,
    [id, organizationId, at],
  );
  return id;
}

const exists = async (table: string, id: string) => (await sql(`select 1 from ${table} where id = ?`, [id])).length === 1;
const events = async (id: string) => Number((await sql<{ n: string }>('select count(*) as n from email_events where email_id = ?', [id]))[0]!.n);

describe('purge-expired (docs/operations.md "Retention")', () => {
  it('the scheduled job deletes emails, their events and verification results past EMAIL_RETENTION_DAYS, and nothing else', async () => {
    const old = await Promise.all([email(45), email(31, 'failed')]);
    const young = await email(29);
    // Still to be sent (e.g. stuck behind an outage): never deleted under a worker.
    const pending = await email(60, 'queued');
    const oldCheck = await verification(40);
    const youngCheck = await verification(1);

    const connection = createRedis(ctx.env.config.redisUrl, 'worker');
    let workers: RunningWorkers | undefined;
    try {
      workers = await startWorkers(ctx.services, connection, [maintenanceProcessor]);
      // The hourly scheduler is registered by the worker.
      const schedulers = await ctx.services.producer.queue('maintenance').getJobSchedulers();
      expect(schedulers.map((s) => s.key ?? s.id)).toContain('purge-expired');
      await ctx.services.producer.add('maintenance', { name: 'purge-expired', data: {}, jobId: 'retention-test' });
      const queue = ctx.services.producer.queue('maintenance');
      const deadline = Date.now() + 15_000;
      let job = await queue.getJob('retention-test');
      while (!job?.finishedOn && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 50));
        job = await queue.getJob('retention-test');
      }
      expect(job?.failedReason).toBeUndefined();
      // The scheduler's first run (at start) may have purged them already: this run then finds none.
      expect(job?.returnvalue).toMatchObject({ purged: { emails: expect.any(Number), verifications: expect.any(Number) }, more: false });
    } finally {
      await workers?.close();
      connection.disconnect();
    }

    for (const id of old) {
      expect(await exists('emails', id)).toBe(false);
      expect(await events(id)).toBe(0);
    }
    expect(await exists('emails', young)).toBe(true);
    expect(await events(young)).toBe(2);
    expect(await exists('emails', pending)).toBe(true);
    expect(await exists('email_verifications', oldCheck)).toBe(false);
    expect(await exists('email_verifications', youngCheck)).toBe(true);
  });

  it('works in batches until nothing old is left, and follows EMAIL_RETENTION_DAYS', async () => {
    const ids = [];
    for (let i = 0; i < 7; i += 1) ids.push(await email(12 + i));
    const kept = await email(3);
    const config = { ...ctx.services.config, emailRetentionDays: 10 };
    const due = Number(
      (await sql<{ n: string }>(`select count(*) as n from emails where created_at < now() - interval '10 days' and status in ('sent', 'failed')`))[0]!.n,
    );
    expect(due).toBeGreaterThanOrEqual(7);
    const first = await purgeExpired(ctx.services.orm.em.fork(), config, { batchSize: 3, pauseMs: 0, duty: 1, budgetMs: 0 });
    // The budget ran out after the first batch: the rest is for the follow-up job.
    expect(first).toEqual({ purged: { emails: 3 }, more: true });
    const rest = await purgeExpired(ctx.services.orm.em.fork(), config, { batchSize: 3, pauseMs: 0, duty: 1 });
    expect(rest.purged.emails).toBe(due - 3);
    expect(rest.more).toBe(false);
    for (const id of ids) expect(await exists('emails', id)).toBe(false);
    expect(await exists('emails', kept)).toBe(true);
  });

  it('keeps webhook deliveries 30 days whatever EMAIL_RETENTION_DAYS says, and everything else for EMAIL_RETENTION_DAYS (docs/operations.md "Retention")', () => {
    for (const emailRetentionDays of [7, 30, 90]) {
      const config = { ...ctx.services.config, emailRetentionDays };
      const days = Object.fromEntries(PURGE_TARGETS.map((t) => [t.name, t.retentionDays(config)]));
      expect(days).toEqual({ emails: emailRetentionDays, verifications: emailRetentionDays, webhook_deliveries: 30 });
    }
  });

  it('a cutoff id sorts below every id made at or after that time, above every one made before', () => {
    const t = Date.now() - 30 * DAY;
    const cutoff = idBefore('eml', new Date(t));
    expect(`eml_${ulid(t - 1).toLowerCase()}` < cutoff).toBe(true);
    expect(`eml_${ulid(t).toLowerCase()}` > cutoff).toBe(true);
  });
});

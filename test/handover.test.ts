import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DeliveryStore, deliverEmail, failInterruptedEmails, UNCERTAIN_REASON } from '../src/shared/emails/deliver.js';
import { HandoverFence } from '../src/shared/emails/handover.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startCountingSink, type CountingSink } from './helpers/counting-sink.js';

// The hand-over fence (docs/operations.md, "Killing a process"): what a run of a send job
// does with an email an earlier run (a dead or stalled worker) left `sending`.
let sink: CountingSink;
let ctx: TestContext;
let token: string;
let organizationId: string;
let fence: HandoverFence;
let store: DeliveryStore;

beforeAll(async () => {
  sink = await startCountingSink();
  ctx = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url });
  ({ token, organizationId } = await createOrg(ctx.services));
  fence = new HandoverFence(ctx.services.redis, ctx.env.config.redisPrefix);
  store = new DeliveryStore(ctx.services.orm, fence);
});
afterAll(async () => {
  await ctx?.close();
  await sink?.close();
});

async function accepted(): Promise<string> {
  const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: bearer(token), payload: { from: 'a@acme.test', to: 'b@example.com', subject: 'Hi', html: '<p>Hi</p>' } });
  return res.json().id;
}

async function status(id: string): Promise<{ status: string; message_id: string | null; failure_reason: string | null }> {
  const [row] = await ctx.services.orm.em.fork().execute<{ status: string; message_id: string | null; failure_reason: string | null }[]>(
    'select status, message_id, failure_reason from emails where id = ?',
    [id],
  );
  return row!;
}

const deliver = (id: string) => deliverEmail(store, ctx.services.mailer, id, { finalAttempt: false });

describe('hand-over fence', () => {
  it('sends once, records sent and clears the key', async () => {
    const id = await accepted();
    expect(await deliver(id)).toMatchObject({ outcome: 'sent' });
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
    expect((await status(id)).status).toBe('sent');
    expect(await fence.read(id)).toBeNull();
    // A second run sends nothing.
    expect(await deliver(id)).toEqual({ outcome: 'skipped', status: 'sent' });
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
  });

  it('takes over an email claimed by a dead worker before its final dot, and sends it once', async () => {
    const id = await accepted();
    expect(await store.claim(id)).toBeDefined(); // the dead worker's claim
    expect(await deliver(id)).toMatchObject({ outcome: 'sent' });
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
    expect((await status(id)).status).toBe('sent');
  });

  it('fences out the first worker if it wakes up after the take-over', async () => {
    const id = await accepted();
    await store.claim(id);
    const taken = await fence.reclaim(id);
    expect(taken).toHaveProperty('token');
    // The stalled first owner reaches its final dot: refused.
    expect(await fence.prepare(id, undefined)).toBeUndefined();
    // The new owner commits.
    const prepared = await fence.prepare(id, (taken as { token: string }).token);
    expect(prepared).toMatch(/^pre:/);
    await fence.dot(id, prepared!);
    expect(await fence.read(id)).toMatch(/^dot:/);
  });

  it('takes over an email whose dead worker got its fence but never wrote the final dot', async () => {
    const id = await accepted();
    await store.claim(id);
    // The dead worker's fence answer came back, and it died before releasing the `.`.
    expect(await fence.prepare(id, undefined)).toMatch(/^pre:/);
    expect(await deliver(id)).toMatchObject({ outcome: 'sent' });
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
    expect((await status(id)).status).toBe('sent');
  });

  it('takes over again from a worker that took over and died too', async () => {
    const id = await accepted();
    await store.claim(id);
    expect(await fence.reclaim(id)).toHaveProperty('token'); // the second worker, dead before its `.`
    expect(await deliver(id)).toMatchObject({ outcome: 'sent' });
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
  });

  it('records the final dot only once it is released, and the acceptance as the answer is read', async () => {
    const id = await accepted();
    const seen: (string | null)[] = [];
    let reading: Promise<void> | undefined;
    const original = fence.dot.bind(fence);
    // What Redis holds when the `.` is released: the `pre:` the worker got, not yet `dot:`.
    fence.dot = (emailId, prepared) => {
      reading = fence.read(emailId).then((v) => void seen.push(v));
      return original(emailId, prepared);
    };
    try {
      expect(await deliver(id)).toMatchObject({ outcome: 'sent' });
    } finally {
      fence.dot = original;
    }
    await reading;
    expect(seen[0]).toMatch(/^pre:/);
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
  });

  it('aborts the SMTP transaction when the fence is lost: the relay gets nothing', async () => {
    const id = await accepted();
    await store.claim(id);
    await fence.reclaim(id); // another worker took it over meanwhile
    // This run believes it holds the first claim (as the stalled worker would).
    const row = await ctx.services.orm.em.fork().execute<{ id: string }[]>('select id from emails where id = ?', [id]);
    expect(row).toHaveLength(1);
    let called = false;
    await expect(
      ctx.services.mailer.send({
        id,
        organizationId,
        from: 'a@acme.test',
        to: 'b@example.com',
        subject: 'Hi',
        html: '<p>Hi</p>',
        text: 'Hi',
        messageId: `${id}@acme.test`,
        fromDomain: 'acme.test',
        beforeCommit: async () => {
          called = true;
          if (!(await fence.prepare(id, undefined))) throw new Error('fence lost');
        },
      }),
    ).rejects.toThrow(/fence lost/);
    expect(called).toBe(true);
    // The pool still works afterwards.
    const other = await accepted();
    expect(await deliver(other)).toMatchObject({ outcome: 'sent' });
    await new Promise((r) => setTimeout(r, 100));
    expect(sink.received.get(`${id}@acme.test`)).toBeUndefined();
  });

  it('records an email the provider accepted before its worker died, without sending it again', async () => {
    const id = await accepted();
    await store.claim(id);
    await fence.accepted(id, `${id}@acme.test`);
    expect(await deliver(id)).toMatchObject({ outcome: 'sent', messageId: `${id}@acme.test` });
    expect(sink.received.get(`${id}@acme.test`)).toBeUndefined();
    expect(await status(id)).toMatchObject({ status: 'sent', message_id: `${id}@acme.test` });
  });

  it('fails an email whose final dot went out without an answer as uncertain at once, never sending it again', async () => {
    const dot = await accepted();
    await store.claim(dot);
    await ctx.services.redis.set(fence.key(dot), 'dot:someone');
    expect(await deliver(dot)).toEqual({ outcome: 'failed', reason: UNCERTAIN_REASON });
    expect(sink.received.get(`${dot}@acme.test`)).toBeUndefined();
    expect(await status(dot)).toMatchObject({ status: 'failed', failure_reason: UNCERTAIN_REASON });
    // A worker that only stalled and reads the relay's 250 late still records it sent.
    await store.markSent({ id: dot, message_id: `${dot}@acme.test`, html: '', text: '', delivered: false });
    expect(await status(dot)).toMatchObject({ status: 'sent', failure_reason: null });
  });

  it('settles the rows whose job is gone after the lease, by their fence', async () => {
    const hook = await ctx.app.inject({ method: 'POST', url: '/api/v2/webhooks', headers: bearer(token), payload: { url: 'http://127.0.0.1:9/hook', events: ['email.failed', 'email.sent'] } });
    expect(hook.statusCode).toBe(200);
    const [dot, acc, pre, none] = [await accepted(), await accepted(), await accepted(), await accepted()];
    for (const id of [dot, acc, pre, none]) await store.claim(id);
    await ctx.services.redis.set(fence.key(dot), 'dot:someone');
    // Written 61 s ago, as the fence writes it (with its 30-minute expiry): old enough to seize.
    await ctx.services.redis.set(fence.key(pre), 'pre:someone', 'PX', 30 * 60_000 - 61_000);
    await fence.accepted(acc, `${acc}@acme.test`);

    const em = ctx.services.orm.em.fork();
    expect(await failInterruptedEmails(em, 60_000, fence)).toEqual({ failed: 0, takeOver: [] }); // within the lease
    await new Promise((r) => setTimeout(r, 20));
    const settled = await failInterruptedEmails(em, 10, fence);
    expect(settled.failed).toBeGreaterThanOrEqual(2); // with earlier tests' rows
    expect(await status(dot)).toMatchObject({ status: 'failed', failure_reason: UNCERTAIN_REASON });
    expect(await status(none)).toMatchObject({ status: 'failed', failure_reason: expect.stringMatching(/^interrupted.*never sent twice/) });
    expect(await status(acc)).toMatchObject({ status: 'sent', message_id: `${acc}@acme.test` });
    // The `.` was never written: seized in the fence and left `sending`, for a send job to
    // take over.
    expect(settled.takeOver).toContainEqual({ id: pre, source: 'api' });
    expect(await status(pre)).toMatchObject({ status: 'sending' });
    expect(await fence.read(pre)).toMatch(/^reclaim:/);
    expect(await deliver(pre)).toMatchObject({ outcome: 'sent' });
    expect(sink.received.get(`${pre}@acme.test`)).toBe(1);
    // A worker that held `none` and only stalled cannot commit it once it was failed.
    expect(await fence.prepare(none, undefined)).toBeUndefined();
    // The failed ones have their email.failed outbox rows, with the reason; the others none.
    const events = await ctx.services.orm.em.fork().execute<{ id: string; reason: string }[]>(
      `select payload->'data'->>'email_id' as id, payload->'data'->>'reason' as reason from webhook_messages where type = 'email.failed' and payload->'data'->>'email_id' in (?, ?, ?, ?)`,
      [dot, acc, pre, none],
    );
    expect(events.map((e) => e.id).sort()).toEqual([dot, none].sort());
    expect(events.find((e) => e.id === dot)?.reason).toBe(UNCERTAIN_REASON);
    // The one the relay had accepted has its email.sent, with the Message-ID recorded.
    const sent = await ctx.services.orm.em.fork().execute<{ message_id: string }[]>(
      `select payload->'data'->>'message_id' as message_id from webhook_messages where type = 'email.sent' and payload->'data'->>'email_id' = ?`,
      [acc],
    );
    expect(sent).toEqual([{ message_id: `${acc}@acme.test` }]);
    await ctx.app.inject({ method: 'DELETE', url: `/api/v2/webhooks/${hook.json().id}`, headers: bearer(token) });
  });

  it('leaves alone a stale email whose pre: or reclaim: was written just now: a worker is at its final dot, or taking it over', async () => {
    const [pre, taken] = [await accepted(), await accepted()];
    for (const id of [pre, taken]) await store.claim(id);
    // Claimed an hour ago (stale), but the fence was written a moment ago.
    await ctx.services.orm.em.fork().execute(`update emails set claimed_at = now() - interval '1 hour' where id in (?, ?)`, [pre, taken]);
    const prepared = await fence.prepare(pre, undefined);
    const token = ((await fence.reclaim(taken)) as { token: string }).token;
    const { takeOver } = await failInterruptedEmails(ctx.services.orm.em.fork(), 60_000, fence);
    // The `pre:` worker's `dot:` still lands, and the one taking over can still commit.
    expect(await fence.read(pre)).toBe(prepared);
    expect(await fence.read(taken)).toBe(token);
    expect(await fence.prepare(taken, token)).toMatch(/^pre:/);
    // Nothing settled: the `reclaim:` one's job is asked for (none added while it runs), the `pre:` one waits for the next run.
    expect(takeOver.map((r) => r.id)).toContain(taken);
    expect(takeOver.map((r) => r.id)).not.toContain(pre);
    expect(await status(pre)).toMatchObject({ status: 'sending' });
    expect(await status(taken)).toMatchObject({ status: 'sending' });
  });

  it('has the reconcile job enqueue a seized email, whose job then takes it over and sends it once', async () => {
    const id = await accepted();
    await store.claim(id);
    await ctx.services.redis.set(fence.key(id), 'pre:a-dead-worker', 'PX', 30 * 60_000 - 61_000);
    await new Promise((r) => setTimeout(r, 20));
    const em = ctx.services.orm.em.fork();
    const reconcile = emailSendProcessor('emails', { sendLeaseMs: 10 }).handlers.reconcile;
    const job = { id: 'reconcile-test', data: {} } as never;
    expect(await reconcile({}, { services: ctx.services, em, log: ctx.services.logger, job })).toMatchObject({ takenOver: expect.any(Number) });
    const queued = await ctx.services.producer.queue('emails').getJob(id);
    expect(await queued?.getState()).toBe('waiting');
    expect(await status(id)).toMatchObject({ status: 'sending' });
    // What that job runs:
    expect(await deliver(id)).toMatchObject({ outcome: 'sent' });
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
  });

  it('keeps a worker that stalled past the lease from committing an email the reconciler took over', async () => {
    const id = await accepted();
    await store.claim(id);
    // The stalled worker had taken the email over from a dead one and not reached its final `.`.
    const taken = await fence.reclaim(id);
    expect(taken).toHaveProperty('token');
    await new Promise((r) => setTimeout(r, 20));
    const { takeOver } = await failInterruptedEmails(ctx.services.orm.em.fork(), 10, fence);
    expect(takeOver).toContainEqual({ id, source: 'api' });
    // It wakes up: its compare-and-set fails, so it aborts the DATA.
    expect(await fence.prepare(id, (taken as { token: string }).token)).toBeUndefined();
    // The job the reconciler enqueued sends it, once.
    expect(await deliver(id)).toMatchObject({ outcome: 'sent' });
    expect(await deliver(id)).toEqual({ outcome: 'skipped', status: 'sent' });
    expect(sink.received.get(`${id}@acme.test`)).toBe(1);
  });
});

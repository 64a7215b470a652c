import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DeliveryStore, deliverEmail, failInterruptedEmails } from '../src/shared/emails/deliver.js';
import { HandoverFence } from '../src/shared/emails/handover.js';
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
    expect(await fence.commit(id, undefined)).toBe(false);
    // The new owner commits.
    expect(await fence.commit(id, (taken as { token: string }).token)).toBe(true);
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
          if (!(await fence.commit(id, undefined))) throw new Error('fence lost');
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

  it('leaves an email whose final dot may have gone out, and the reconciler fails it after the lease', async () => {
    const dot = await accepted();
    const acc = await accepted();
    await store.claim(dot);
    await store.claim(acc);
    await ctx.services.redis.set(fence.key(dot), 'dot:someone');
    await fence.accepted(acc, `${acc}@acme.test`);
    expect(await deliver(dot)).toEqual({ outcome: 'skipped', status: 'sending' });
    expect(sink.received.get(`${dot}@acme.test`)).toBeUndefined();

    const em = ctx.services.orm.em.fork();
    expect(await failInterruptedEmails(em, 60_000, fence)).toBe(0); // within the lease
    await new Promise((r) => setTimeout(r, 20));
    expect(await failInterruptedEmails(em, 10, fence)).toBeGreaterThanOrEqual(1); // with earlier tests' rows
    expect(await status(dot)).toMatchObject({ status: 'failed', failure_reason: expect.stringMatching(/never sent twice/) });
    expect(await status(acc)).toMatchObject({ status: 'sent', message_id: `${acc}@acme.test` });
  });
});

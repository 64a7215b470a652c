import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QueueProducer } from '../src/shared/queues/producer.js';
import { createSubscriber, patchSubscriber } from '../src/shared/subscribers/service.js';
import type { TestContext } from './helpers/context.js';
import { until } from './helpers/until.js';
import { confirmationJobId } from '../src/shared/subscribers/confirmation.js';
import { confirmationJobsOf, doubleOptInContext, finishedConfirmation, finishedJob as finishedJobOf } from './helpers/double-opt-in.js';

/**
 * The confirmation email of double opt-in survives a Redis failure after the subscriber's
 * commit, as an email does (the reconciler enqueues it again).
 */

let ctx: TestContext;
let organizationId: string;
let close: (() => Promise<void>) | undefined;

beforeAll(async () => {
  ({ ctx, organizationId, close } = await doubleOptInContext());
});
afterAll(async () => {
  await close?.();
});

/** The service's producer, except that every enqueue fails as with Redis down. */
function producerWithRedisDown(): QueueProducer {
  const producer = Object.create(ctx.services.producer) as QueueProducer;
  const down = async () => {
    throw new Error('Connection is closed.');
  };
  producer.add = down;
  producer.addBulk = down;
  return producer;
}

function finishedJob(id: string) {
  return finishedJobOf(ctx, id);
}

function sql<T>(text: string, params: unknown[] = []): Promise<T[]> {
  return ctx.services.orm.em.fork().execute(text, params) as Promise<T[]>;
}

/** Makes the subscriber's confirmation record five minutes old; the job id of the record. */
async function ageConfirmation(subscriberId: string): Promise<string> {
  const [record] = await sql<{ created_at: Date }>(
    `update subscriber_confirmations set created_at = date_trunc('milliseconds', now()) - interval '5 minutes' where subscriber_id = ? returning created_at`,
    [subscriberId],
  );
  return confirmationJobId(subscriberId, new Date(record!.created_at).getTime());
}

async function reconcile(): Promise<{ requeued: number }> {
  const jobId = `reconcile-test-${Date.now()}`;
  await ctx.services.producer.add('subscribers', { name: 'reconcile', data: {}, jobId });
  const job = await finishedJob(jobId);
  return job!.returnvalue as { requeued: number };
}

describe('double opt-in: a confirmation whose job is lost after the commit', () => {
  it('is enqueued again by the subscribers reconciler and handed to the send pipeline', async () => {
    const deps = { em: ctx.services.orm.em.fork(), producer: producerWithRedisDown(), clock: () => new Date() };
    // The write commits, then the enqueue fails: the caller hears of the outage.
    await expect(createSubscriber(deps, organizationId, { email: 'lost-job@example.com', name: 'Lou' })).rejects.toThrow(/closed/);
    const [subscriber] = await sql<{ id: string; status: string }>('select id, status from subscribers where email = ?', ['lost-job@example.com']);
    expect(subscriber?.status).toBe('PENDING_CONFIRMATION');
    expect(await confirmationJobsOf(ctx, subscriber!.id)).toHaveLength(0);

    // Within the grace period the reconciler leaves it to its (maybe still coming) job.
    expect((await reconcile()).requeued).toBe(0);

    const jobId = await ageConfirmation(subscriber!.id);
    // (The scheduled run of the reconciler may have come first: either way one job is made.)
    expect((await reconcile()).requeued).toBeLessThanOrEqual(1);
    const job = await finishedJob(jobId);
    const { emailId, skipped } = job!.returnvalue as { emailId: string; skipped: boolean };
    expect(skipped).toBe(false);
    const [email] = await sql<{ to_address: string; subscriber_id: string; status: string }>(
      'select to_address, subscriber_id, status from emails where id = ?',
      [emailId],
    );
    expect(email).toMatchObject({ to_address: 'lost-job@example.com', subscriber_id: subscriber!.id, status: 'queued' });

    // Handed over: no longer owed, and the reconciler has nothing left to do.
    expect(await sql('select 1 from subscriber_confirmations where subscriber_id = ?', [subscriber!.id])).toHaveLength(0);
    expect((await reconcile()).requeued).toBe(0);
  });

  it('is no longer owed once its job has failed, so failed ones cannot fill the reconciler\'s page', async () => {
    const deps = { em: ctx.services.orm.em.fork(), producer: producerWithRedisDown(), clock: () => new Date() };
    await expect(createSubscriber(deps, organizationId, { email: 'failed-job@example.com' })).rejects.toThrow(/closed/);
    const [subscriber] = await sql<{ id: string }>('select id from subscribers where email = ?', ['failed-job@example.com']);
    // Its job ran and failed for good (one attempt, an error that is not an outage).
    const jobId = await ageConfirmation(subscriber!.id);
    await ctx.services.producer.queue('subscribers').add('no-such-job' as never, {} as never, { jobId, attempts: 1 });
    await until(() => ctx.services.producer.queue('subscribers').getJob(jobId).then((j) => j?.getState()), (state) => state === 'failed');

    expect((await reconcile()).requeued).toBe(0);
    expect(await sql('select 1 from subscriber_confirmations where subscriber_id = ?', [subscriber!.id])).toHaveLength(0);
    // The failed job stays, for the operator.
    expect(await (await ctx.services.producer.queue('subscribers').getJob(jobId))?.getState()).toBe('failed');
  });

  it('is owed again, with a job and an email of its own, when the subscriber is pending again', async () => {
    const deps = { em: ctx.services.orm.em.fork(), producer: ctx.services.producer, clock: () => new Date() };
    const first = await createSubscriber(deps, organizationId, { email: 'pending-again@example.com' });
    const firstJob = await finishedConfirmation(ctx, first.subscriber.id);
    // Out of PENDING_CONFIRMATION into a state that opts in like a new contact (the first
    // job and its email are still kept), then pending again.
    await sql(`update subscribers set status = 'TRANSACTIONAL' where id = ?`, [first.subscriber.id]);
    const again = await createSubscriber(deps, organizationId, { email: 'pending-again@example.com' });
    expect(again.subscriber.status).toBe('PENDING_CONFIRMATION');
    const secondJob = await finishedConfirmation(ctx, first.subscriber.id, 2);
    expect(secondJob!.id).not.toBe(firstJob!.id);
    const emails = [firstJob, secondJob].map((j) => (j!.returnvalue as { emailId: string }).emailId);
    expect(new Set(emails).size).toBe(2);
    expect(await sql('select 1 from subscriber_confirmations where subscriber_id = ?', [first.subscriber.id])).toHaveLength(0);
  });

  it('is owed again when a pending subscriber changes address: the first link signs the old one', async () => {
    const deps = { em: ctx.services.orm.em.fork(), producer: ctx.services.producer, clock: () => new Date() };
    const first = await createSubscriber(deps, organizationId, { email: 'typo@exmaple.com' });
    const firstJob = await finishedConfirmation(ctx, first.subscriber.id);
    const patched = await patchSubscriber(deps, organizationId, first.subscriber.id, { email: 'fixed@example.com' });
    expect(patched.subscriber.status).toBe('PENDING_CONFIRMATION');
    const secondJob = await finishedConfirmation(ctx, first.subscriber.id, 2);
    expect((secondJob!.returnvalue as { message: { to: string } }).message.to).toBe('fixed@example.com');
    expect((secondJob!.returnvalue as { emailId: string }).emailId).not.toBe((firstJob!.returnvalue as { emailId: string }).emailId);
    // A change of name alone owes nothing.
    await patchSubscriber(deps, organizationId, first.subscriber.id, { name: 'Fixed' });
    expect(await confirmationJobsOf(ctx, first.subscriber.id)).toHaveLength(2);
  });

  it('sends one email when the address changes before the first job runs: the older job leaves it to the newer', async () => {
    // The first write's job is not queued (Redis down), so it runs only after the change.
    const down = { em: ctx.services.orm.em.fork(), producer: producerWithRedisDown(), clock: () => new Date() };
    await expect(createSubscriber(down, organizationId, { email: 'first@exmaple.com' })).rejects.toThrow(/closed/);
    const [subscriber] = await sql<{ id: string }>('select id from subscribers where email = ?', ['first@exmaple.com']);
    const [first] = await sql<{ created_at: Date }>('select created_at from subscriber_confirmations where subscriber_id = ?', [subscriber!.id]);
    const up = { em: ctx.services.orm.em.fork(), producer: ctx.services.producer, clock: () => new Date(Date.now() + 5) };
    await patchSubscriber(up, organizationId, subscriber!.id, { email: 'second@example.com' });
    const newer = await finishedConfirmation(ctx, subscriber!.id);
    expect((newer.returnvalue as { message: { to: string } }).message.to).toBe('second@example.com');
    // The first record's job, late.
    const late = confirmationJobId(subscriber!.id, new Date(first!.created_at).getTime());
    await ctx.services.producer.add('subscribers', { name: 'send-confirmation', data: { subscriberId: subscriber!.id, owedSince: new Date(first!.created_at).getTime() }, jobId: late });
    expect((await finishedJob(late))!.returnvalue).toEqual({ skipped: true });
    expect(await sql('select id from emails where subscriber_id = ?', [subscriber!.id])).toHaveLength(1);
  });

  it('is owed only until its job has run when Redis is up', async () => {
    const deps = { em: ctx.services.orm.em.fork(), producer: ctx.services.producer, clock: () => new Date() };
    const { subscriber } = await createSubscriber(deps, organizationId, { email: 'fine@example.com' });
    expect(subscriber.status).toBe('PENDING_CONFIRMATION');
    await finishedConfirmation(ctx, subscriber.id);
    expect(await sql('select 1 from subscriber_confirmations where subscriber_id = ?', [subscriber.id])).toHaveLength(0);
  });

  it('is not owed by a subscriber created SUBSCRIBED', async () => {
    const deps = { em: ctx.services.orm.em.fork(), producer: ctx.services.producer, clock: () => new Date() };
    const { subscriber } = await createSubscriber(deps, organizationId, { email: 'direct@example.com', skipDoubleOptIn: true });
    expect(subscriber.status).toBe('SUBSCRIBED');
    expect(await sql('select 1 from subscriber_confirmations where subscriber_id = ?', [subscriber.id])).toHaveLength(0);
  });
});

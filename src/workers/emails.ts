import { DelayedError } from 'bullmq';
import { deliverEmail, type DeliverOutcome, failInterruptedEmails, queuedEmailsPage, RetryLaterError, SUPPRESSED_REASON, UNCERTAIN_REASON, UNSUBSCRIBED_REASON } from '../shared/emails/deliver.js';
import { emailIdsByQueue, purgeIdempotencyKeys, SEND_BATCH_PRIORITY, sendJob, type EmailQueueName } from '../shared/emails/service.js';
import { defineProcessor, type JobContext, type QueueProcessor } from './runner.js';

export interface EmailProcessorOptions {
  /** Emails handed over at once by one worker process. */
  concurrency?: number;
  /** How often the reconciler runs (else EMAIL_RECONCILE_EVERY_MS, else a minute). */
  reconcileEveryMs?: number;
  /** A queued email younger than this is left to its (maybe still coming) job (else EMAIL_RECONCILE_GRACE_MS). */
  reconcileGraceMs?: number;
  /** A claimed (`sending`) row older than this was interrupted. */
  sendLeaseMs?: number;
}

// The hand-over of one message takes seconds at worst (socket timeout 60 s); a claim older
// than ten minutes can only belong to a worker that died.
const DEFAULTS: Required<EmailProcessorOptions> = {
  concurrency: 100,
  reconcileEveryMs: 60_000,
  reconcileGraceMs: 60_000,
  sendLeaseMs: 10 * 60_000,
};
const PURGE_EVERY_MS = 3_600_000;

// A worker that dies (SIGKILL, OOM, lost host) holds its jobs' locks until they expire; then
// BullMQ's stalled-job check hands them to another worker, and the fence (handover.ts) tells
// that worker what the dead one got done. A short lock bounds that wait (default 30 s + 30 s);
// the lock is renewed every half of it, so only a worker whose event loop is blocked for
// 10 s loses it while alive, and even then the fence keeps the email from going out twice.
// Stalls are not the job's fault (the handler is idempotent): allowed many times.
const SEND_WORKER_OPTIONS = { lockDuration: 10_000, stalledInterval: 5_000, maxStalledCount: 10 };
const RECONCILE_PAGE = 1_000;

// Provider throttling (421/450/454...): retried after 5 s, 10 s, 20 s ... capped at 15 min,
// each with jitter, for as long as it lasts; it never fails the email.
const THROTTLE_BASE_MS = 5_000;
const THROTTLE_MAX_MS = 15 * 60_000;

export function throttleDelay(throttled: number): number {
  const ceiling = Math.min(THROTTLE_MAX_MS, THROTTLE_BASE_MS * 2 ** Math.min(throttled, 20));
  return Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
}

// `send-batch` expansions run a few at a time in a process (four: services.sendBatchExpansions,
// container.ts), in chunks: a campaign's fan-out brings a hundred batches at once, and expanding them all together would queue 100,000 job
// additions on the producer's connection, whose commands time out after 3 s (then the
// worker pauses as if Redis were down).
//
// Priorities (BullMQ serves its wait list first, then prioritized jobs, lowest number
// first): single sends have none and overtake everything; the sends of an expanded batch
// have EXPANDED_SEND_PRIORITY, ahead of the batches still to expand (SEND_BATCH_PRIORITY,
// service.ts). A worker therefore expands the next batch only when the sends of the earlier
// ones are out, instead of filling every concurrency slot with expansions (waiting on each
// other) while the sends they made queue behind the remaining batches: a backlog of
// 2,500 batches then delivered about 1 email in 20 until every batch was expanded.
const EXPAND_CHUNK = 250;
const EXPANDED_SEND_PRIORITY = 1;

function expandedSendJob(emailId: string) {
  const job = sendJob(emailId);
  return { ...job, opts: { ...job.opts, priority: EXPANDED_SEND_PRIORITY } };
}

/**
 * The send path's counters (docs/operations.md). `source` follows the queue: campaign
 * emails have their own; test sends and confirmation emails count as `api`. Suppressed
 * recipients are counted by the send gate.
 */
function recordOutcome(ctx: JobContext, result: DeliverOutcome, finalAttempt: boolean): void {
  const { metrics } = ctx.services;
  if (result.outcome === 'sent' || result.outcome === 'delivered') {
    metrics.emailsSent.inc({ source: ctx.job.queueName === 'campaign-emails' ? 'campaign' : 'api' });
    // The file transport reports delivery at once (docs/emails.md "Transports").
    if (result.outcome === 'delivered') metrics.emailsDelivered.inc();
  } else if (result.outcome === 'failed' && result.reason !== SUPPRESSED_REASON) {
    metrics.emailsFailed.inc({ reason: failureCode(result.reason, finalAttempt) });
  }
}

function failureCode(reason: string, finalAttempt: boolean): string {
  if (reason.startsWith('rendering failed')) return 'rendering';
  // A campaign email whose contact unsubscribed (or was deleted) since the fan-out.
  if (reason === UNSUBSCRIBED_REASON) return 'unsubscribed';
  // The final `.` went out and no answer came back (deliver.ts): docs/operations.md's `interrupted`.
  if (reason.startsWith(UNCERTAIN_REASON)) return 'interrupted';
  return finalAttempt ? 'attempts_exhausted' : 'rejected';
}

async function send(payload: { emailId: string; throttled?: number }, ctx: JobContext) {
  const { job } = ctx;
  const finalAttempt = job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
  try {
    // Suppressed recipients are failed by the claim and never handed over (the claim in emails/queries.ts).
    const result = await deliverEmail(ctx.services.deliveryStore, ctx.services.mailer, payload.emailId, {
      finalAttempt,
      // The job's logger is made only if something is logged.
      get log() {
        return ctx.log;
      },
    });
    // Suppressed and unsubscribed recipients are the audience's doing, not a delivery problem.
    if (result.outcome === 'failed' && result.reason !== SUPPRESSED_REASON && result.reason !== UNSUBSCRIBED_REASON) {
      ctx.log.warn({ emailId: payload.emailId, reason: result.reason }, 'email failed');
    }
    recordOutcome(ctx, result, finalAttempt);
    return result;
  } catch (error) {
    if (error instanceof RetryLaterError && error.throttle && job.token) {
      // Moved back to delayed without spending an attempt.
      const throttled = (payload.throttled ?? 0) + 1;
      await job.updateData({ ...payload, throttled });
      await job.moveToDelayed(Date.now() + throttleDelay(throttled - 1), job.token);
      ctx.log.info({ emailId: payload.emailId, throttled, reason: error.message }, 'provider throttled; retrying later');
      throw new DelayedError();
    }
    throw error;
  }
}

/**
 * The consumer of an email queue: `send` hands one email to the provider; on the `emails`
 * queue it also runs the reconciler and the Idempotency-Key purge on schedules. Campaign
 * mail gets its own queue (`campaign-emails`) served by the same factory, so transactional
 * mail overtakes it.
 */
export function emailSendProcessor(queue: EmailQueueName = 'emails', options: EmailProcessorOptions = {}): QueueProcessor<EmailQueueName> {
  const o = { ...DEFAULTS, ...options };
  return defineProcessor({
    queue,
    concurrency: o.concurrency,
    workerOptions: SEND_WORKER_OPTIONS,
    handlers: {
      send,
      'send-batch': (payload, ctx) =>
        ctx.services.sendBatchExpansions(async () => {
          for (let i = 0; i < payload.emailIds.length; i += EXPAND_CHUNK) {
            await ctx.services.producer.addBulk(queue, payload.emailIds.slice(i, i + EXPAND_CHUNK).map(expandedSendJob));
          }
          return { enqueued: payload.emailIds.length };
        }),
      reconcile: async (_payload, ctx) => {
        const { failed: interrupted, takeOver } = await failInterruptedEmails(ctx.em, o.sendLeaseMs, ctx.services.deliveryStore.fence);
        const graceMs = options.reconcileGraceMs ?? ctx.services.config.emailReconcileGraceMs ?? o.reconcileGraceMs;
        if (interrupted > 0) ctx.log.warn({ interrupted }, 'failed emails interrupted mid hand-over');
        // Seized in the fence and still `sending`: a send job takes each over (deliver.ts).
        const takenOver = takeOver.length > 0 ? await requeueMissing(ctx, takeOver) : 0;
        if (takenOver > 0) ctx.log.warn({ takenOver }, 're-enqueued emails interrupted before their final dot, to be taken over');
        let afterId: string | undefined;
        let requeued = 0;
        const createdBefore = await oldestUnexpandedBatch(ctx);
        for (;;) {
          const page = await queuedEmailsPage(ctx.em, { graceMs, afterId, limit: RECONCILE_PAGE, createdBefore });
          if (page.length === 0) break;
          afterId = page[page.length - 1]!.id;
          requeued += await requeueMissing(ctx, page);
          if (page.length < RECONCILE_PAGE) break;
        }
        if (requeued > 0) ctx.log.warn({ requeued }, 're-enqueued queued emails whose job was missing');
        return { interrupted, takenOver, requeued };
      },
      'purge-idempotency-keys': async (_payload, ctx) => ({ purged: await purgeIdempotencyKeys(ctx.em) }),
    },
    async onStart(services) {
      const producerQueue = services.producer.queue(queue);
      // BullMQ's queue-wide limiter: one budget for every worker process together.
      const rate = services.config.mail.ratePerSecond;
      if (rate) await producerQueue.setGlobalRateLimit(rate, 1_000);
      else await producerQueue.removeGlobalRateLimit();
      if (queue === 'emails') {
        await producerQueue.upsertJobScheduler('emails-reconcile', { every: options.reconcileEveryMs ?? services.config.emailReconcileEveryMs ?? o.reconcileEveryMs }, { name: 'reconcile', data: {} });
        await producerQueue.upsertJobScheduler('emails-purge-idempotency-keys', { every: PURGE_EVERY_MS }, { name: 'purge-idempotency-keys', data: {} });
      }
    },
  });
}

/**
 * The emails of a `send-batch` job still waiting to be expanded have no job of their own
 * yet: not missing. Without this bound, a backlog older than the grace period made the
 * reconciler enqueue every one of them again (145,000 job additions in one run, measured by
 * bench:backlog), which took the worker's time from sending. The bound is the creation of the
 * oldest batch waiting in either email queue (its emails were committed just before it).
 */
async function oldestUnexpandedBatch(ctx: JobContext): Promise<Date | undefined> {
  let oldest: number | undefined;
  for (const name of ['emails', 'campaign-emails'] as const) {
    const queue = ctx.services.producer.queue(name);
    // BullMQ's score of a prioritized job: priority * 2^32 + a counter (FIFO within a priority).
    // Not a public API (BullMQ lists prioritized jobs only in score order, which would mean
    // reading every expanded send first): bullmq's version is pinned, and
    // test/bullmq-internals.test.ts fails if the layout changes.
    const [id] = await ctx.services.redis.zrangebyscore(queue.keys.prioritized!, SEND_BATCH_PRIORITY * 2 ** 32, '+inf', 'LIMIT', 0, 1);
    const timestamp = id ? ((await queue.getJob(id))?.timestamp ?? NaN) : NaN;
    if (Number.isFinite(timestamp)) oldest = Math.min(oldest ?? timestamp, timestamp);
  }
  // A little slack: the rows' created_at comes from PostgreSQL's clock, the job's from Node's.
  return oldest === undefined ? undefined : new Date(oldest - 5_000);
}

/** Enqueues the emails whose job is gone; a job that finished while its row is still queued is replaced. */
async function requeueMissing(ctx: JobContext, rows: { id: string; source: 'api' | 'campaign' | 'test' }[]): Promise<number> {
  let requeued = 0;
  for (const [name, ids] of emailIdsByQueue(rows)) {
    const queue = ctx.services.producer.queue(name);
    // BullMQ's public Queue.getJob (one HGETALL each, sent together on the connection): about
    // as cheap as reading the `finishedOn` field of the job hashes directly (30 ms against
    // 27 ms a page of 1,000 on the project's machine), without relying on BullMQ's layout.
    const jobs = await Promise.all(ids.map((id) => queue.getJob(id)));
    const missing: string[] = [];
    for (let i = 0; i < ids.length; i++) {
      const job = jobs[i];
      if (!job) missing.push(ids[i]!);
      else if (job.finishedOn) {
        await queue.remove(ids[i]!);
        missing.push(ids[i]!);
      }
    }
    if (missing.length > 0) {
      await ctx.services.producer.addBulk(name, missing.map(sendJob));
      requeued += missing.length;
    }
  }
  return requeued;
}

export const emailsProcessor = emailSendProcessor('emails');

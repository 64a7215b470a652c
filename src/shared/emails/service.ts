import { raw, type EntityManager } from '@mikro-orm/postgresql';
import type { Orm } from '../db/orm.js';
import { Coalescer } from './coalescer.js';
import type { JobsOptions } from 'bullmq';
import { createHash } from 'node:crypto';
import stableStringify from 'safe-stable-stringify';
import { Email, type EmailSource } from '../db/entities/email.js';
import { pageByIdCursor } from '../db/cursor.js';
import { NotFoundError } from '../errors.js';
import type { Logger } from '../logger.js';
import type { QueueProducer } from '../queues/producer.js';
import type { NewEmail } from './input.js';
import { inTransaction, type Sql } from '../db/sql.js';
import { deleteExpiredIdempotencyKeys } from './queries.js';
import { acceptRequests, insertEmails, type AcceptRequest, type AcceptResult, type CreatedEmails, type Idempotency } from './accept.js';
import { lastEventFilter, type LastEvent } from './last-event.js';

/** The queue an email's send job goes to: campaign mail has its own, so transactional mail overtakes it. */
export type EmailQueueName = 'emails' | 'campaign-emails';

export function queueForSource(source: EmailSource): EmailQueueName {
  return source === 'campaign' ? 'campaign-emails' : 'emails';
}

/** The ids of the emails, grouped by the queue of their send jobs (in their order). */
export function emailIdsByQueue(emails: readonly { id: string; source?: EmailSource }[]): Map<EmailQueueName, string[]> {
  const byQueue = new Map<EmailQueueName, string[]>();
  for (const e of emails) {
    const queue = queueForSource(e.source ?? 'api');
    const ids = byQueue.get(queue);
    if (ids) ids.push(e.id);
    else byQueue.set(queue, [e.id]);
  }
  return byQueue;
}

// Transient failures (4xx other than throttling, connection errors) are retried with
// exponential backoff and jitter: 2 s, 4 s, 8 s ... about 17 min in all before the email is
// failed. Throttling answers never count against these attempts (see docs/emails.md).
export const SEND_ATTEMPTS = 10;
export const SEND_JOB_OPTIONS: JobsOptions = {
  attempts: SEND_ATTEMPTS,
  backoff: { type: 'exponential', delay: 2_000, jitter: 0.5 },
};

// Single sends go to BullMQ's wait list (no priority), which a worker serves before any
// prioritized job, so they overtake a backlog; a batch's expansion job comes last
// (SEND_BATCH_PRIORITY), after the sends of the batches already expanded (workers/emails.ts).
export const SEND_BATCH_PRIORITY = 2;

export function sendJob(emailId: string) {
  return { name: 'send' as const, data: { emailId }, jobId: emailId, opts: SEND_JOB_OPTIONS };
}

export { insertEmails } from './accept.js';
export type { CreatedEmails, Idempotency } from './accept.js';

/**
 * Enqueues one send job per email (jobId = email id, so a repeat is a no-op). With
 * `fanOut`, several emails go as ONE `send-batch` job that a worker expands into those
 * per-email jobs: the API's cost of a 100-email batch is one job, not a hundred. Never
 * throws: the rows are committed, and the reconciler enqueues whatever a failure here left
 * out.
 */
export async function enqueueEmailSends(
  producer: QueueProducer,
  emails: { id: string; source?: EmailSource }[],
  logger?: Logger,
  options: { fanOut?: boolean } = {},
): Promise<void> {
  for (const [queue, ids] of emailIdsByQueue(emails)) {
    try {
      if (options.fanOut && ids.length > 1) {
        await producer.add(queue, { name: 'send-batch', data: { emailIds: ids }, jobId: `batch-${ids[0]}`, opts: { ...SEND_JOB_OPTIONS, priority: SEND_BATCH_PRIORITY } });
      } else {
        await producer.addBulk(queue, ids.map(sendJob));
      }
    } catch (error) {
      logger?.warn({ err: error, count: ids.length }, 'enqueue after commit failed; the reconciler will enqueue these emails');
    }
  }
}

export interface CreateEmailsDeps {
  producer: QueueProducer;
  logger?: Logger;
}

/**
 * Accepts emails: writes the rows (status queued), commits, then enqueues their send jobs.
 * Used by `POST /emails/batch`, and by any feature that sends mail of its own (double
 * opt-in confirmation, campaign test sends); `POST /emails` goes through `EmailWriter`,
 * which writes with the same function. With an idempotency key, the key row and the emails
 * are written by one statement; a concurrent request with the same key waits for the first
 * to commit and answers its ids.
 */
export async function createEmails(
  em: EntityManager,
  deps: CreateEmailsDeps,
  inputs: NewEmail[],
  // One or the other: the keyed write (acceptRequests) has no place for rows of its own.
  options:
    | { idempotency?: Idempotency; alongside?: never }
    | {
        idempotency?: never;
        /** Rows that belong to the emails (e.g. attachments), written in the same transaction. */
        alongside: (sql: Sql, ids: string[]) => Promise<void>;
      } = {},
): Promise<CreatedEmails> {
  if (inputs.length === 0) return { ids: [], replayed: false };
  if (options.alongside) {
    // Rows that belong to the emails go in the same transaction; enqueued after the commit.
    const alongside = options.alongside;
    const ids = await inTransaction(em, async (sql) => {
      const written = await insertEmails(sql, inputs);
      await alongside(sql, written);
      return written;
    });
    await enqueueEmailSends(deps.producer, ids.map((id, i) => ({ id, source: inputs[i]!.source })), deps.logger, { fanOut: true });
    return { ids, replayed: false };
  }
  const [result] = await acceptRequests(em, [{ emails: inputs, idempotency: options.idempotency }]);
  if ('error' in result!) throw result.error;
  if (!result!.ok.replayed) {
    await enqueueEmailSends(deps.producer, result!.ok.ids.map((id, i) => ({ id, source: inputs[i]!.source })), deps.logger, { fanOut: true });
  }
  return result!.ok;
}

/**
 * `POST /emails`, with or without an Idempotency-Key: group commit. Sends that arrive while
 * a write is in flight are gathered and written together by `acceptRequests` (one
 * statement, one commit, one WAL flush) and enqueued with one bulk call, so PostgreSQL and
 * Redis work per email shrinks as load grows, and an idle server adds no delay. Each caller
 * is answered only after its own row is committed and its job enqueued (or left to the
 * reconciler), with its own result: its ids, the earlier request's ids for a repeated key,
 * or its own error.
 */
const WRITES_IN_FLIGHT = 2;

export class EmailWriter {
  private readonly coalescer: Coalescer<AcceptRequest, AcceptResult>;

  constructor(orm: Orm, deps: CreateEmailsDeps) {
    this.coalescer = new Coalescer(async (requests) => {
      const results = await acceptRequests(orm.em.fork(), requests);
      const written: { id: string; source?: EmailSource }[] = [];
      results.forEach((result, i) => {
        if ('ok' in result && !result.ok.replayed) {
          result.ok.ids.forEach((id, n) => written.push({ id, source: requests[i]!.emails[n]!.source }));
        }
      });
      await enqueueEmailSends(deps.producer, written, deps.logger);
      return results;
      // Two writes in flight at most: the requests that arrive meanwhile wait for one to
      // finish and go in the next, so a write carries more rows as load grows, and the
      // fixed cost of a statement and its commit (most of PostgreSQL's work for one row,
      // bench/ingest-sql.ts) is shared by more emails.
    }, WRITES_IN_FLIGHT);
  }

  async write(input: NewEmail, idempotency?: Idempotency): Promise<CreatedEmails> {
    const result = await this.coalescer.submit({ emails: [input], idempotency });
    if ('error' in result) throw result.error;
    return result.ok;
  }
}

/**
 * SHA-256 of a JSON value with its object keys sorted, so key order does not matter. The
 * serialization (safe-stable-stringify) is byte for byte the one of the hand-written
 * stableJson it replaced, so fingerprints stored before the change still match.
 */
export function requestHash(route: string, body: unknown): string {
  return createHash('sha256').update(route).update('\n').update(stableStringify(body) ?? 'null').digest('hex');
}

/** Deletes Idempotency-Key rows past their 24 h; returns how many. */
export function purgeIdempotencyKeys(em: EntityManager): Promise<number> {
  return deleteExpiredIdempotencyKeys(em);
}

/** One email of the organization, any source (docs/emails.md). */
export async function getEmail(em: EntityManager, organizationId: string, id: string): Promise<Email> {
  const email = await em.findOne(Email, { id, organizationId });
  if (!email) throw new NotFoundError(`No email ${id}`);
  return email;
}

/** A list row: the bodies are not read. */
export type EmailListRow = Omit<Email, 'html' | 'text' | 'content'>;

export interface ListEmailsQuery {
  limit?: number;
  after?: string;
  before?: string;
  /** The recipient's address, exactly (case and a display name aside): an index range, even with 1,000,000 emails. */
  to?: string;
  lastEvent?: LastEvent;
}

/** API sends of the organization, newest first, by id cursor (docs/emails.md, docs/foundation.md "Identifiers, time and lists"). */
export async function listEmails(em: EntityManager, organizationId: string, query: ListEmailsQuery): Promise<{ items: EmailListRow[]; hasMore: boolean }> {
  const filters = {
    source: 'api' as const,
    // Bare addresses on both sides (`Name <addr>` or `addr`), by the index's own expression.
    ...(query.to !== undefined ? { [raw('email_bare_address(to_address)')]: raw('email_bare_address(?)', [query.to]) } : {}),
    ...(query.lastEvent !== undefined ? lastEventFilter(query.lastEvent) : {}),
  };
  return pageByIdCursor<Email, EmailListRow>(em, Email, { scope: { organizationId }, filters }, { ...query, limit: query.limit ?? 20 }, 'email', ['html', 'text', 'content']);
}

import { raw, type EntityManager } from '@mikro-orm/postgresql';
import type { Orm } from '../db/orm.js';
import { Coalescer } from './coalescer.js';
import type { JobsOptions } from 'bullmq';
import { createHash } from 'node:crypto';
import { Email, type EmailSource } from '../db/entities/email.js';
import { ConflictError, NotFoundError, ValidationError } from '../errors.js';
import { newId } from '../ids.js';
import type { Logger } from '../logger.js';
import type { QueueProducer } from '../queues/producer.js';
import type { NewEmail } from './input.js';
import { lastEventFilter, type LastEvent } from './last-event.js';

/** The queue an email's send job goes to: campaign mail has its own, so transactional mail overtakes it. */
export type EmailQueueName = 'emails' | 'campaign-emails';

export function queueForSource(source: EmailSource): EmailQueueName {
  return source === 'campaign' ? 'campaign-emails' : 'emails';
}

// Transient failures (4xx other than throttling, connection errors) are retried with
// exponential backoff and jitter: 2 s, 4 s, 8 s ... about 17 min in all before the email is
// failed. Throttling answers never count against these attempts (see docs/emails.md).
export const SEND_ATTEMPTS = 10;
export const SEND_JOB_OPTIONS: JobsOptions = {
  attempts: SEND_ATTEMPTS,
  backoff: { type: 'exponential', delay: 2_000, jitter: 0.5 },
};

export function sendJob(emailId: string) {
  return { name: 'send' as const, data: { emailId }, jobId: emailId, opts: SEND_JOB_OPTIONS };
}

const COLUMNS = [
  'id',
  'organization_id',
  'source',
  'campaign_id',
  'subscriber_id',
  'from_address',
  'to_address',
  'cc',
  'bcc',
  'reply_to',
  'subject',
  'content_kind',
  'content',
  'preview',
  'text',
  'tags',
  'headers',
] as const;
const ROW_PLACEHOLDERS = `(?, ?, ?, ?, ?, ?, ?, ?::jsonb, ?::jsonb, ?::jsonb, ?, ?, ?, ?, ?, ?::jsonb, ?::jsonb, now(), now())`;
const INSERT_HEAD = `insert into emails (${COLUMNS.join(', ')}, created_at, updated_at) values `;

const json = (value: unknown) => (value === null || value === undefined ? null : JSON.stringify(value));

/**
 * Inserts the rows (status queued) in ONE multi-row statement and returns their ids, in
 * order. The caller owns the transaction (or relies on the statement being atomic) and
 * enqueues with `enqueueEmailSends` after the commit.
 */
export async function insertEmails(em: EntityManager, inputs: NewEmail[], ids: string[] = inputs.map(() => newId('eml'))): Promise<string[]> {
  if (inputs.length === 0) return [];
  const params: unknown[] = [];
  inputs.forEach((e, i) => {
    params.push(
      ids[i],
      e.organizationId,
      e.source ?? 'api',
      e.campaignId ?? null,
      e.subscriberId ?? null,
      e.from,
      e.to,
      json(e.cc),
      json(e.bcc),
      json(e.replyTo),
      e.subject,
      e.contentKind,
      e.content,
      e.preview ?? null,
      e.text ?? null,
      JSON.stringify(e.tags ?? []),
      JSON.stringify(e.headers ?? {}),
    );
  });
  await em.execute(INSERT_HEAD + inputs.map(() => ROW_PLACEHOLDERS).join(', '), params, 'run');
  return ids;
}

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
  const byQueue = new Map<EmailQueueName, string[]>();
  for (const e of emails) {
    const queue = queueForSource(e.source ?? 'api');
    const ids = byQueue.get(queue);
    if (ids) ids.push(e.id);
    else byQueue.set(queue, [e.id]);
  }
  for (const [queue, ids] of byQueue) {
    try {
      if (options.fanOut && ids.length > 1) {
        await producer.add(queue, { name: 'send-batch', data: { emailIds: ids }, jobId: `batch-${ids[0]}`, opts: SEND_JOB_OPTIONS });
      } else {
        await producer.addBulk(queue, ids.map(sendJob));
      }
    } catch (error) {
      logger?.warn({ err: error, count: ids.length }, 'enqueue after commit failed; the reconciler will enqueue these emails');
    }
  }
}

export interface Idempotency {
  key: string;
  /** SHA-256 of the request (route and validated body). */
  requestHash: string;
  /** How long to wait for an earlier request with the key to finish before 409 (ms). */
  waitMs?: number;
}

export interface CreateEmailsDeps {
  producer: QueueProducer;
  logger?: Logger;
}

export interface CreatedEmails {
  ids: string[];
  /** True when an earlier request with the same Idempotency-Key is answered again. */
  replayed: boolean;
}

// How long a request waits for an earlier one with the same key to finish before 409.
const IDEMPOTENCY_WAIT_MS = 5_000;
export const IDEMPOTENCY_TTL_HOURS = 24;

/**
 * Accepts emails: writes the rows (status queued), commits, then enqueues their send jobs.
 * Used by `POST /emails` and the batch, and by any feature that sends mail of its own
 * (double opt-in confirmation, campaign test sends). With an idempotency key, the key row
 * and the emails are written in one transaction; a concurrent request with the same key
 * waits for the first to commit and answers its ids.
 */
export async function createEmails(
  em: EntityManager,
  deps: CreateEmailsDeps,
  inputs: NewEmail[],
  options: { idempotency?: Idempotency } = {},
): Promise<CreatedEmails> {
  if (inputs.length === 0) return { ids: [], replayed: false };
  const idem = options.idempotency;
  let result: CreatedEmails;
  if (!idem) {
    // One statement: atomic on its own, no BEGIN/COMMIT round trips on the hot path.
    result = { ids: await insertEmails(em, inputs), replayed: false };
  } else {
    result = await createIdempotent(em, inputs, idem);
  }
  if (!result.replayed) {
    await enqueueEmailSends(deps.producer, result.ids.map((id, i) => ({ id, source: inputs[i]!.source })), deps.logger, { fanOut: true });
  }
  return result;
}

/**
 * The hot path of `POST /emails` without an Idempotency-Key: group commit. Sends that arrive
 * while a write is in flight are gathered and written together, one multi-row INSERT
 * (one commit, one WAL flush) and one bulk enqueue, so PostgreSQL and Redis work per email
 * shrinks as load grows, and an idle server adds no delay. Each caller is answered only
 * after its row is committed and its job enqueued (or left to the reconciler).
 */
export class EmailWriter {
  private readonly coalescer: Coalescer<NewEmail, string>;

  constructor(orm: Orm, deps: CreateEmailsDeps) {
    this.coalescer = new Coalescer(async (inputs) => {
      const ids = await insertEmails(orm.em.fork(), inputs);
      await enqueueEmailSends(deps.producer, ids.map((id, i) => ({ id, source: inputs[i]!.source })), deps.logger);
      return ids;
    });
  }

  write(input: NewEmail): Promise<string> {
    return this.coalescer.submit(input);
  }
}

async function createIdempotent(em: EntityManager, inputs: NewEmail[], idem: Idempotency): Promise<CreatedEmails> {
  const organizationId = inputs[0]!.organizationId;
  try {
    return await em.transactional(async (tx) => {
      await tx.execute(`set local lock_timeout = ${Math.max(1, Math.round(idem.waitMs ?? IDEMPOTENCY_WAIT_MS))}`, [], 'run');
      const ids = inputs.map(() => newId('eml'));
      // Inserts the key, or takes over an expired one. A concurrent insert of the same key
      // waits here until the first transaction ends (then conflicts and updates nothing).
      const claimed = await tx.execute<{ created: number }[]>(
        `insert into email_idempotency_keys (organization_id, idempotency_key, request_hash, email_ids, created_at)
         values (?, ?, ?, ?::text[], now())
         on conflict (organization_id, idempotency_key) do update
           set request_hash = excluded.request_hash, email_ids = excluded.email_ids, created_at = excluded.created_at
           where email_idempotency_keys.created_at < now() - interval '${IDEMPOTENCY_TTL_HOURS} hours'
         returning 1 as created`,
        // A PG array literal: ids are [0-9a-z_] only.
        [organizationId, idem.key, idem.requestHash, `{${ids.join(',')}}`],
        'all',
      );
      if (claimed.length > 0) {
        await insertEmails(tx, inputs, ids);
        return { ids, replayed: false };
      }
      const [row] = await tx.execute<{ request_hash: string; email_ids: string[] }[]>(
        'select request_hash, email_ids from email_idempotency_keys where organization_id = ? and idempotency_key = ?',
        [organizationId, idem.key],
        'all',
      );
      if (!row) throw new ConflictError('idempotency_conflict', 'The Idempotency-Key changed state during the request; retry');
      if (row.request_hash !== idem.requestHash) {
        throw new ConflictError('idempotency_conflict', 'This Idempotency-Key was already used with a different request body');
      }
      return { ids: row.email_ids, replayed: true };
    });
  } catch (error) {
    if ((error as { code?: string }).code === '55P03') {
      throw new ConflictError('idempotency_conflict', 'A request with this Idempotency-Key is still being processed; retry shortly');
    }
    throw error;
  }
}

/** SHA-256 of a JSON value with its object keys sorted, so key order does not matter. */
export function requestHash(route: string, body: unknown): string {
  return createHash('sha256').update(route).update('\n').update(stableJson(body)).digest('hex');
}

function stableJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stableJson).join(',')}]`;
  if (value && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stableJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

/** Deletes Idempotency-Key rows past their 24 h; returns how many. */
export async function purgeIdempotencyKeys(em: EntityManager): Promise<number> {
  const rows = await em.execute<{ n: string }[]>(
    `with gone as (delete from email_idempotency_keys where created_at < now() - interval '${IDEMPOTENCY_TTL_HOURS} hours' returning 1)
     select count(*) as n from gone`,
    [],
    'all',
  );
  return Number(rows[0]?.n ?? 0);
}

/** One email of the organization, any source (spec 4.13). */
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
  /** The recipient's address, exactly (case aside): an index range, even with 1,000,000 emails. */
  to?: string;
  lastEvent?: LastEvent;
}

/** API sends of the organization, newest first, by id cursor (spec 4.12, contract 3). */
export async function listEmails(em: EntityManager, organizationId: string, query: ListEmailsQuery): Promise<{ items: EmailListRow[]; hasMore: boolean }> {
  const limit = query.limit ?? 20;
  if (query.after !== undefined && query.before !== undefined) {
    throw new ValidationError('Pass after or before, not both', [{ path: 'after', message: 'cannot be combined with before' }]);
  }
  const cursor = query.after ?? query.before;
  const cursorField = query.after !== undefined ? 'after' : 'before';
  if (cursor !== undefined) {
    const found = await em.count(Email, { id: cursor, organizationId });
    if (found === 0) throw new ValidationError(`Unknown ${cursorField} cursor`, [{ path: cursorField, message: `no email ${cursor} in this organization` }]);
  }
  const fields = { exclude: ['html', 'text', 'content'] as const };
  const filters = {
    ...(query.to !== undefined ? { [raw('lower(to_address)')]: query.to.trim().toLowerCase() } : {}),
    ...(query.lastEvent !== undefined ? lastEventFilter(query.lastEvent) : {}),
  };
  if (query.before !== undefined) {
    const rows = await em.find(
      Email,
      { organizationId, source: 'api', id: { $gt: query.before }, ...filters },
      { orderBy: { id: 'asc' }, limit: limit + 1, ...fields },
    );
    return { items: rows.slice(0, limit).reverse(), hasMore: rows.length > limit };
  }
  const rows = await em.find(
    Email,
    { organizationId, source: 'api', ...(query.after !== undefined ? { id: { $lt: query.after } } : {}), ...filters },
    { orderBy: { id: 'desc' }, limit: limit + 1, ...fields },
  );
  return { items: rows.slice(0, limit), hasMore: rows.length > limit };
}

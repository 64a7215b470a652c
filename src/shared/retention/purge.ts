import type { EntityManager } from '@mikro-orm/postgresql';
import { WEBHOOK_DELIVERY_RETENTION_MS } from '../webhooks/service.js';
import { encodeTime } from 'ulid';
import type { Config } from '../config.js';
import type { IdPrefix } from '../ids.js';

/**
 * Retention (contract 21): rows older than their retention are deleted by the hourly
 * `purge-expired` job (src/workers/maintenance.ts), a few thousand rows per statement.
 *
 * Why this does not delay sends:
 * - Each batch is one short statement in its own transaction; nothing is held between
 *   batches. After each batch the purge rests, at least PURGE_PAUSE_MS and long enough
 *   that it works at most PURGE_DUTY of the time: on a busy database a batch takes longer,
 *   so the purge slows down with it and leaves PostgreSQL's CPU and I/O to the send path.
 * - Rows are picked by primary key: ids are ULIDs, so "created before the cutoff" is
 *   `id < prefix_{cutoff time}`, a range of the primary key index (no scan, no new index).
 * - `for update skip locked`: a row a worker has locked is skipped, never waited for.
 * - Only rows whose work is over: an email still `queued` or `sending` is kept.
 */
export interface PurgeTarget {
  /** Name in the job's result and the logs. */
  name: string;
  table: string;
  idPrefix: IdPrefix | string;
  retentionDays(config: Config): number;
  /** More conditions a row must meet to go (SQL over the table's columns). */
  where?: string;
}

export const PURGE_TARGETS: readonly PurgeTarget[] = [
  {
    // Their events (opens, clicks, delivery events) go with them: the statement-level
    // trigger of migration 20261123070000 deletes the events of every deleted email.
    name: 'emails',
    table: 'emails',
    idPrefix: 'eml',
    retentionDays: (config) => config.emailRetentionDays,
    where: `status in ('sent', 'failed')`,
  },
  {
    // The answers of POST /verify. The trusted history (verification_history: bounces,
    // complaints, engagement) is the suppression knowledge of the service and is kept.
    name: 'verifications',
    table: 'email_verifications',
    idPrefix: 'ver',
    retentionDays: (config) => config.emailRetentionDays,
  },
  {
    // Webhook deliveries (the outbox rows, docs/webhooks.md) are kept 30 days whatever
    // EMAIL_RETENTION_DAYS says; their retries end within about 28 hours.
    name: 'webhook_deliveries',
    table: 'webhook_messages',
    idPrefix: 'msg',
    retentionDays: () => WEBHOOK_DELIVERY_RETENTION_MS / 86_400_000,
  },
];

export interface PurgeOptions {
  now?: Date;
  /** Rows per statement. */
  batchSize?: number;
  /** Least pause between two statements. */
  pauseMs?: number;
  /** Largest share of the time spent in a statement (0 < duty <= 1; 1: no pacing). */
  duty?: number;
  /** Stop (and report `more`) after this long; the rest is purged by the next run. */
  budgetMs?: number;
  targets?: readonly PurgeTarget[];
}

export interface PurgeResult {
  purged: Record<string, number>;
  /** True when the budget ran out with rows left to purge. */
  more: boolean;
}

export const PURGE_BATCH_SIZE = 2_000;
export const PURGE_PAUSE_MS = 20;
// A fifth: bench:retention keeps the send rate during a purge of 1,000,000 emails at or
// above 0.8 of the rate without one; an idle database still purges ~10,000 rows a second.
export const PURGE_DUTY = 0.2;
const BUDGET_MS = 5 * 60_000;

/** The smallest id of its prefix created at `time`: every id below it is older. */
export function idBefore(prefix: string, time: Date): string {
  return `${prefix}_${encodeTime(time.getTime(), 10).toLowerCase()}`;
}

/** Deletes one batch of a target's expired rows; returns how many. */
export async function purgeBatch(em: EntityManager, target: PurgeTarget, cutoff: Date, batchSize: number): Promise<number> {
  const rows = await em.execute<Array<{ n: number }>>(
    `with batch as (
       select id from ${target.table}
        where id < ? and created_at < ?${target.where ? ` and ${target.where}` : ''}
        order by id
        limit ?
        for update skip locked
     ), gone as (
       delete from ${target.table} t using batch where t.id = batch.id returning 1
     )
     select count(*)::int as n from gone`,
    [idBefore(target.idPrefix, cutoff), cutoff, batchSize],
    'all',
  );
  return Number(rows[0]?.n ?? 0);
}

export async function purgeExpired(em: EntityManager, config: Config, options: PurgeOptions = {}): Promise<PurgeResult> {
  const now = options.now ?? new Date();
  const batchSize = options.batchSize ?? PURGE_BATCH_SIZE;
  const pauseMs = options.pauseMs ?? PURGE_PAUSE_MS;
  const duty = Math.min(1, Math.max(0.01, options.duty ?? PURGE_DUTY));
  // Rest this long per millisecond of work.
  const rest = (1 - duty) / duty;
  const deadline = Date.now() + (options.budgetMs ?? BUDGET_MS);
  const purged: Record<string, number> = {};
  for (const target of options.targets ?? PURGE_TARGETS) {
    const cutoff = new Date(now.getTime() - target.retentionDays(config) * 86_400_000);
    purged[target.name] = 0;
    for (;;) {
      const started = Date.now();
      const n = await purgeBatch(em, target, cutoff, batchSize);
      purged[target.name] += n;
      if (n < batchSize) break;
      if (Date.now() >= deadline) return { purged, more: true };
      const pause = Math.max(pauseMs, (Date.now() - started) * rest);
      if (pause > 0) await new Promise((resolve) => setTimeout(resolve, pause));
    }
  }
  return { purged, more: false };
}

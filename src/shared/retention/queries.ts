import type { EntityManager } from '@mikro-orm/postgresql';
import { encodeTime } from 'ulid';
import type { Config } from '../config.js';
import type { IdPrefix } from '../ids.js';
import { WEBHOOK_DELIVERY_RETENTION_MS } from '../webhooks/service.js';

/**
 * The data access of retention (purge.ts): which tables are purged, under which extra
 * conditions, and the one statement that deletes a batch of a table's expired rows.
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

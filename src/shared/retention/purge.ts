import type { EntityManager } from '@mikro-orm/postgresql';
import type { Config } from '../config.js';
import { PURGE_TARGETS, purgeBatch, type PurgeTarget } from './queries.js';

/**
 * Retention (docs/operations.md "Retention"): rows older than their retention are deleted by the
 * hourly `purge-expired` job (src/workers/maintenance.ts), a few thousand rows per statement.
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
export { idBefore, PURGE_TARGETS, purgeBatch, type PurgeTarget } from './queries.js';

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

import type { EntityManager } from '@mikro-orm/postgresql';
import { inTransaction } from './sql.js';

/** Statements that belong to no feature: the connection probe and transaction-scoped locks. */

type Execute = Pick<EntityManager, 'execute'>;

/**
 * Holds a lock on `key` until the transaction of `tx` ends: serialises the check-then-write
 * sections of one key (a cap per organization, a reuse by name) across processes.
 */
export async function lockForTransaction(tx: Execute, key: string): Promise<void> {
  await tx.execute('select pg_advisory_xact_lock(hashtextextended(?, 0))', [key]);
}

/** Whether PostgreSQL answers: one round trip on a pooled connection. */
export async function ping(em: EntityManager): Promise<unknown> {
  return em.getConnection().execute('select 1');
}

/** Whether `table` exists yet with a `status` column (a feature's migration may not have run). */
export async function hasStatusColumn(em: Execute, table: string): Promise<boolean> {
  const found = await em.execute<Array<{ found: boolean }>>(
    `select exists (select 1 from information_schema.columns
           where table_schema = current_schema() and table_name = ? and column_name = 'status') as found`,
    [table],
  );
  return Boolean(found[0]?.found);
}

/**
 * Rows of `table` by status, in a transaction of its own capped by `timeoutMs` (a GROUP BY
 * over a large table is not free). `table` is a constant of the caller, never input.
 */
export async function countByStatus(em: EntityManager, table: 'emails' | 'campaigns', timeoutMs: number): Promise<Array<{ status: string; count: string }>> {
  return em.transactional(async (tx) => {
    await tx.execute(`set local statement_timeout = ${timeoutMs}`);
    return tx.execute<Array<{ status: string; count: string }>>(`select status, count(*) as count from ${table} group by status`);
  });
}

/** A table that has grown since PostgreSQL last gathered its planner statistics. */
export interface GrownTable {
  table: string;
  /** Pages at the last ANALYZE or VACUUM (`pg_class.relpages`; 0 when never). */
  pagesThen: number;
  pagesNow: number;
}

/**
 * The tables of the current schema that are at least `factor` times larger than at their last
 * ANALYZE or VACUUM (counting an unanalysed table as `minPages`) and still under `maxPages`,
 * among those the database user may analyse (its own: another's ANALYZE is only a warning,
 * which would leave relpages as they were): one pass over the catalog, no table read.
 */
export async function grownTables(em: Execute, options: { factor: number; minPages: number; maxPages: number }): Promise<GrownTable[]> {
  const rows = await em.execute<Array<{ table: string; pages_then: number; pages_now: string }>>(
    `select c.relname as "table", c.relpages as pages_then, pg_relation_size(c.oid) / current_setting('block_size')::int as pages_now
       from pg_class c join pg_namespace n on n.oid = c.relnamespace
      where n.nspname = current_schema() and c.relkind = 'r' and pg_has_role(c.relowner, 'USAGE') and c.relpages < ?
        and pg_relation_size(c.oid) / current_setting('block_size')::int >= ? * greatest(c.relpages, ?)
      order by c.relname`,
    [options.maxPages, options.factor, options.minPages],
  );
  return rows.map((r) => ({ table: r.table, pagesThen: Number(r.pages_then), pagesNow: Number(r.pages_now) }));
}

/**
 * ANALYZE of one table, unless another process is analysing it for the same reason (a
 * transaction-scoped advisory lock taken without waiting) or a lock is not granted within
 * `lockTimeoutMs` (autovacuum busy with it): whether it ran. `table` comes from the catalog
 * (`grownTables`), quoted as an identifier.
 */
export async function analyzeTable(em: EntityManager, table: string, lockTimeoutMs: number): Promise<boolean> {
  return inTransaction(
    em,
    async (sql) => {
      const [lock] = await sql.query<{ locked: boolean }>('select pg_try_advisory_xact_lock(hashtextextended(?, 0)) as locked', [`mailroom:analyze:${table}`]);
      if (!lock?.locked) return false;
      await sql.query(`analyze "${table.replaceAll('"', '""')}"`);
      return true;
    },
    { lockTimeoutMs },
  );
}

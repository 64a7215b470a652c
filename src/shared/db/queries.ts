import type { EntityManager } from '@mikro-orm/postgresql';

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

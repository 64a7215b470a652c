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

import type { EntityManager } from '@mikro-orm/postgresql';
import pg from 'pg';
import { initOrm, type Orm } from '../../src/shared/db/orm.js';
import { inTransaction, withConnection } from '../../src/shared/db/sql.js';
import { idempotencyKeyLock } from '../../src/shared/emails/queries.js';

/** The server of DATABASE_URL (or the default), with another database name. */
export function databaseUrl(name: string): string {
  const url = new URL(process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/mailroom');
  url.pathname = `/${name}`;
  return url.toString();
}

export async function adminQuery(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl('postgres') });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

export async function dropDatabase(name: string): Promise<void> {
  await adminQuery(`drop database if exists "${name}" with (force)`);
}

/** Name of the migrated template this run's test databases are copied from. */
export function templateName(): string {
  const name = process.env.MAILROOM_TEST_TEMPLATE;
  if (!name) throw new Error('MAILROOM_TEST_TEMPLATE is not set: run the tests through vitest (global setup)');
  return name;
}

/**
 * Runs `lock` (a `lock table …` statement) in a transaction of its own on one of `em`'s
 * connections and holds it until `release` is called (another session busy with a table).
 */
export async function holdLock(em: EntityManager, lock: string): Promise<{ release(): Promise<void> }> {
  let done!: () => void;
  const held = new Promise<void>((resolve) => (done = resolve));
  let locked!: () => void;
  const isLocked = new Promise<void>((resolve) => (locked = resolve));
  const holder = inTransaction(em, async (tx) => {
    await tx.query(lock);
    locked();
    await held;
  });
  await Promise.race([isLocked, holder]);
  return {
    release: async () => {
      done();
      await holder;
    },
  };
}

/**
 * Runs `work` on an ORM of its own with a pool of one connection, then returns the names of
 * the statements prepared on that connection (`pg_prepared_statements` is per session): every
 * statement `work` ran went through it.
 */
export async function preparedOnOneConnection(url: string, work: (orm: Orm) => Promise<void>): Promise<string[]> {
  const orm = await initOrm({ databaseUrl: url, poolSize: 1 });
  try {
    await work(orm);
    const rows = await withConnection(orm.em, (sql) => sql.query<{ name: string }>('select name from pg_prepared_statements order by name'));
    return rows.map((r) => r.name);
  } finally {
    await orm.close();
  }
}

/**
 * A key that another request is writing now, as that request holds it: its advisory lock
 * taken and its row inserted, in a transaction left open until `release` rolls it back.
 */
export async function holdIdempotencyKey(url: string, organizationId: string, key: string, requestHash: string): Promise<{ release(): Promise<void> }> {
  const holder = new pg.Client({ connectionString: url });
  await holder.connect();
  await holder.query('begin');
  await holder.query(`select pg_advisory_xact_lock(${idempotencyKeyLock('$1::text', '$2::text')})`, [organizationId, key]);
  await holder.query(`insert into email_idempotency_keys (organization_id, idempotency_key, request_hash, email_ids) values ($1, $2, $3, '{}')`, [organizationId, key, requestHash]);
  return {
    async release() {
      await holder.query('rollback');
      await holder.end();
    },
  };
}

import type { EntityManager } from '@mikro-orm/postgresql';
import type { Knex } from '@mikro-orm/knex';

/**
 * Plain SQL on a pooled connection of the ORM. The audience write path (an upsert of a few
 * statements, at thousands a second) runs here rather than through `em.execute`, which
 * costs two to three times as much CPU per statement; it shares MikroORM's pool, so the
 * process still holds one pool. Placeholders are `?`, as with `em.execute`.
 */
export interface Sql {
  /**
   * With `name`, the statement is prepared once per connection and then only bound and
   * executed (no parse or plan): for hot statements whose text never changes.
   */
  query<T = Record<string, unknown>>(text: string, values?: readonly unknown[], name?: string): Promise<T[]>;
}

/** Either a raw connection or an EntityManager (reads that are not on the hot path). */
export type Db = Sql | Pick<EntityManager, 'execute'>;

interface PgConnection {
  query(text: string | { name: string; text: string; values: unknown[] }, values?: readonly unknown[]): Promise<{ rows: unknown[] }>;
}

/**
 * Whether statements given a name are prepared on their connection: the ORM's
 * `namedStatements` option (DATABASE_PREPARED_STATEMENTS, db/orm.ts), kept in the pool's own
 * settings. Off, every statement goes unnamed (parsed and planned each time), as a
 * transaction-mode pooler that does not track prepared statements needs.
 */
function namesStatements(client: { config: unknown }): boolean {
  return (client.config as { mailroomNamedStatements?: boolean }).mailroomNamedStatements !== false;
}

function run(connection: PgConnection, text: string, values: readonly unknown[], name: string | undefined) {
  return name ? connection.query({ name, text: toPg(text), values: values as unknown[] }) : connection.query(toPg(text), values as unknown[]);
}

const numbered = new Map<string, string>();
// The statements of the code are a few hundred texts of a few KiB at most; a longer or a
// thousand-and-first text is numbered every time rather than kept.
const NUMBERED_MAX_TEXTS = 1_000;
const NUMBERED_MAX_LENGTH = 16_384;

/** `?` placeholders to `$1, $2, …` (none of our statements uses the jsonb `?` operator). */
function toPg(text: string): string {
  let out = numbered.get(text);
  if (out === undefined) {
    let n = 0;
    out = text.replace(/\?/g, () => `$${++n}`);
    if (numbered.size < NUMBERED_MAX_TEXTS && text.length <= NUMBERED_MAX_LENGTH) numbered.set(text, out);
  }
  return out;
}

export async function rows<T>(db: Db, text: string, values: readonly unknown[] = []): Promise<T[]> {
  if ('query' in db) return db.query<T>(text, values);
  return (await db.execute(text, values as never[])) as T[];
}

export interface TransactionOptions {
  /**
   * `synchronous_commit = off` for this transaction: the commit returns before its WAL is
   * flushed. A crash of PostgreSQL itself may lose the last fraction of a second of such
   * commits (never corrupt or half-apply them).
   */
  asyncCommit?: boolean;
  /** `lock_timeout` for this transaction (ms): a statement waiting longer on any lock (a row, a table, a relation being extended) fails with 55P03. */
  lockTimeoutMs?: number;
}

/** Runs `work` on one pooled connection, outside any transaction (several reads in a row). */
export async function withConnection<T>(em: EntityManager, work: (sql: Sql) => Promise<T>): Promise<T> {
  const client = em.getKnex().client;
  const named = namesStatements(client);
  const connection = (await client.acquireConnection()) as PgConnection;
  try {
    return await work({
      async query<R>(text: string, values: readonly unknown[] = [], name?: string) {
        return (await run(connection, text, values, named ? name : undefined)).rows as R[];
      },
    });
  } finally {
    await client.releaseConnection(connection);
  }
}

/** Runs `work` in a transaction on one pooled connection; rolls back when it throws. */
export async function inTransaction<T>(em: EntityManager, work: (sql: Sql) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
  const client = em.getKnex().client;
  const named = namesStatements(client);
  const connection = (await client.acquireConnection()) as PgConnection;
  const sql: Sql = {
    async query<R>(text: string, values: readonly unknown[] = [], name?: string) {
      return (await run(connection, text, values, named ? name : undefined)).rows as R[];
    },
  };
  try {
    // One round trip: the transaction's settings travel with its BEGIN.
    let begin = 'begin';
    if (options.asyncCommit) begin += '; set local synchronous_commit = off';
    if (options.lockTimeoutMs !== undefined) begin += `; set local lock_timeout = ${Math.max(1, Math.round(options.lockTimeoutMs))}`;
    await connection.query(begin);
    const result = await work(sql);
    await connection.query('commit');
    return result;
  } catch (error) {
    await connection.query('rollback').catch(() => {});
    throw error;
  } finally {
    await client.releaseConnection(connection);
  }
}

/**
 * The `Sql` of an EntityManager: inside its transaction (`em.transactional`) when it has
 * one, so the statements join the ORM's writes; else on a pooled connection. Values are
 * bound, never inlined (MikroORM's `execute` inlines JSON into the text, and costs two to
 * three times as much a statement).
 */
export function sqlOf(em: EntityManager): Sql {
  return {
    async query<R>(text: string, values: readonly unknown[] = [], name?: string) {
      const knex = em.getConnection().getKnex();
      const statement = knex.raw(text, values as never[]);
      if (name && namesStatements(knex.client)) statement.options({ name });
      const trx = em.getTransactionContext<Knex.Transaction>();
      return ((await (trx ? statement.transacting(trx) : statement)) as { rows: R[] }).rows;
    },
  };
}

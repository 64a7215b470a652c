import { MikroORM, PostgreSqlDriver, type Options } from '@mikro-orm/postgresql';
import pg from 'pg';
import type { Logger } from '../logger.js';
import { entities } from './entities/index.js';

export type Orm = MikroORM;
export type { EntityManager } from '@mikro-orm/postgresql';

export interface OrmOptions {
  databaseUrl: string;
  logger?: Logger;
  /** Connections in this process's pool. */
  poolSize?: number;
  /** Named prepared statements on the hot paths (db/sql.ts; DATABASE_PREPARED_STATEMENTS); default true. */
  namedStatements?: boolean;
}

// How long a request waits for PostgreSQL before it is answered 503 rather than hanging.
const CONNECT_TIMEOUT_MS = 3_000;
const ACQUIRE_TIMEOUT_MS = 5_000;

export function ormOptions(options: OrmOptions): Options {
  return {
    driver: PostgreSqlDriver,
    clientUrl: options.databaseUrl,
    entities,
    // The migrator and the migrations are loaded by `migrate` alone (below). Go through it:
    // `orm.migrator` without it finds no list and would look for migration files in ./migrations.
    migrations: {
      snapshot: false,
      transactional: true,
      allOrNothing: true,
      tableName: 'mikro_orm_migrations',
    },
    forceUtcTimezone: true,
    // A fork per request or job is mandatory: the global EntityManager throws if used.
    allowGlobalContext: false,
    pool: { min: 0, max: options.poolSize ?? 10, acquireTimeoutMillis: ACQUIRE_TIMEOUT_MS, idleTimeoutMillis: 30_000 },
    driverOptions: {
      // Read by db/sql.ts from the pool's settings (knex keeps unknown keys).
      mailroomNamedStatements: options.namedStatements ?? true,
      connection: { connectionTimeoutMillis: CONNECT_TIMEOUT_MS, application_name: 'mailroom' },
      acquireConnectionTimeout: ACQUIRE_TIMEOUT_MS,
      // knex writes its own warnings (e.g. a pooled connection dropped by the server) with
      // console.log; route them into pino so every line of the process stays structured.
      log: {
        warn: (message: unknown) => options.logger?.warn({ orm: true }, String(message)),
        error: (message: unknown) => options.logger?.error({ orm: true }, String(message)),
        deprecate: (message: unknown) => options.logger?.debug({ orm: true }, String(message)),
        debug: (message: unknown) => options.logger?.debug({ orm: true }, String(message)),
      },
    },
    discovery: { warnWhenNoEntities: false },
    debug: false,
    // Connect on first query, so a process starts (and answers 503) while PostgreSQL is down.
    connect: false,
    logger: (message: string) => options.logger?.debug({ orm: true }, message),
  };
}

export async function initOrm(options: OrmOptions): Promise<Orm> {
  return MikroORM.init(ormOptions(options));
}

// What a migration run sees when another process applies the same migrations at that moment
// (two `npm start` or `migrate` at once on a new database): a table, type or index it is
// creating already exists (42P07, 42710, 23505 on the catalog), or a deadlock with it (40P01).
const CONCURRENT_MIGRATION = new Set(['42P07', '42710', '23505', '40P01']);
const MIGRATION_ATTEMPTS = 20;

function sqlStateOf(error: unknown): string | undefined {
  for (let e = error as { code?: unknown; cause?: unknown } | undefined, depth = 0; e && depth < 5; e = e.cause as typeof e, depth++) {
    if (typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code)) return e.code;
  }
  return undefined;
}

/**
 * Applies every committed migration that has not run yet; returns the names applied. Each
 * migration runs in a transaction, so a run that collides with another process's (its own
 * migration rolled back) waits and starts again: it then finds them applied. No advisory
 * lock, which a pooler in transaction mode would not keep (README "Running in production").
 */
export async function migrate(orm: Orm): Promise<string[]> {
  // Loaded here, not with the ORM: the migrator's dependencies (umzug and its command-line
  // toolkit, a JSON schema validator) are memory that a serving process would hold for nothing.
  const [{ Migrator }, { migrationsList }] = await Promise.all([import('@mikro-orm/migrations'), import('./migrations/index.js')]);
  orm.config.set('migrations', { ...orm.config.get('migrations'), migrationsList });
  Migrator.register(orm);
  for (let attempt = 1; ; attempt++) {
    try {
      const applied = await orm.getMigrator().up();
      return applied.map((m) => m.name);
    } catch (error) {
      const state = sqlStateOf(error);
      if (attempt >= MIGRATION_ATTEMPTS || state === undefined || !CONCURRENT_MIGRATION.has(state)) throw error;
      await new Promise((resolve) => setTimeout(resolve, 250 * attempt));
    }
  }
}

/**
 * Creates the database named in the URL when it does not exist (npm start on a fresh machine),
 * through the `postgres` database. Where that one cannot be reached (a pooler such as PgBouncer
 * serving only the application's database, a managed role without access to it), a connection
 * to the database itself tells that it exists. Not the other way round: PgBouncer remembers a
 * login that failed and holds the next client for server_login_retry (15 s), so a first try of a
 * database that is then created would stall the migrations right after.
 */
export async function ensureDatabase(databaseUrl: string): Promise<boolean> {
  const url = new URL(databaseUrl);
  const name = decodeURIComponent(url.pathname.replace(/^\//, ''));
  if (!name) throw new Error('DATABASE_URL names no database');
  const admin = new URL(databaseUrl);
  admin.pathname = '/postgres';
  const client = new pg.Client({ connectionString: admin.toString(), connectionTimeoutMillis: CONNECT_TIMEOUT_MS });
  try {
    await client.connect();
  } catch (error) {
    await client.end().catch(() => {});
    // No answer from the server (refused, timed out): the database would give none either, and
    // asking again only waits. An answer (an error of the server or of a pooler) falls through.
    if (!(error instanceof pg.DatabaseError)) throw error;
    // The postgres database refused (not served, not allowed): the answer of the database
    // itself says whether it exists, and why not when it does not.
    const own = await connectionError(databaseUrl);
    if (own === undefined) return false;
    throw own;
  }
  try {
    const found = await client.query('select 1 from pg_database where datname = $1', [name]);
    if (found.rowCount) return false;
    try {
      await client.query(`create database "${name.replace(/"/g, '""')}"`);
    } catch (error) {
      // Another process created it at the same moment: 42P04 duplicate_database, or 23505
      // unique_violation when both inserts into pg_database raced.
      const code = (error as { code?: string }).code;
      if (code !== '42P04' && code !== '23505') throw error;
      return false;
    }
    return true;
  } finally {
    await client.end();
  }
}

/** Why the database of the URL refuses a connection; undefined when it takes one. */
async function connectionError(databaseUrl: string): Promise<unknown> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: CONNECT_TIMEOUT_MS });
  try {
    await client.connect();
    return undefined;
  } catch (error) {
    return error;
  } finally {
    await client.end().catch(() => {});
  }
}

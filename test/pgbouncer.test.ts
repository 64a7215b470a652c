import pg from 'pg';
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/api/app.js';
import { closeServices, createServices, type Services } from '../src/shared/container.js';
import { ensureDatabase, initOrm } from '../src/shared/db/orm.js';
import { sqlOf, withConnection } from '../src/shared/db/sql.js';
import { createLogger } from '../src/shared/logger.js';
import { createRedis, waitForRedis } from '../src/shared/redis.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import type { App } from '../src/api/types.js';
import { bearer, createOrg, createTestEnv, type TestEnv } from './helpers/context.js';
import { dropDatabase } from './helpers/database.js';
import { PGBOUNCER, startPgBouncer, type PgBouncer } from './helpers/pgbouncer.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';
import { runCli } from './helpers/process.js';
import { until } from './helpers/until.js';

/**
 * DATABASE_URL through PgBouncer in transaction pooling mode (README "Running in production"). PgBouncer before
 * 1.21 does not track prepared statements, so with DATABASE_PREPARED_STATEMENTS=false every
 * hot statement goes unnamed (docs/operations.md "PostgreSQL"). Debian's pgbouncer; .ci/run
 * installs it.
 */

if (!existsSync(PGBOUNCER)) throw new Error(`no PgBouncer at ${PGBOUNCER}: apt-get install -y pgbouncer`);

let env: TestEnv;
let bouncer: PgBouncer;
let sink: SmtpSink;
let services: Services;
let app: App;
let workers: RunningWorkers;
const connection = { current: undefined as ReturnType<typeof createRedis> | undefined };

beforeAll(async () => {
  bouncer = await startPgBouncer({ serverConnections: 2 });
  sink = await startSmtpSink({ parse: false });
  env = await createTestEnv({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url });
  const config = { ...env.config, databaseUrl: bouncer.through(env.config.databaseUrl), databasePreparedStatements: false };
  services = await createServices(config, createLogger({ level: config.logLevel }));
  await waitForRedis(services.redis);
  app = await buildApp(services);
  await app.ready();
  connection.current = createRedis(config.redisUrl, 'worker');
  workers = await startWorkers(services, connection.current, [emailSendProcessor('emails')]);
});

afterAll(async () => {
  await workers?.close();
  connection.current?.disconnect();
  await app?.close();
  if (services) await closeServices(services);
  await bouncer?.stop();
  await sink?.close();
  await env?.dispose();
});

describe('PostgreSQL through PgBouncer in transaction mode (DATABASE_PREPARED_STATEMENTS=false)', () => {
  // With named statements on, this fails: "prepared statement "mailroom_emails_insert" already
  // exists" (a client's Parse on a server connection another client prepared it on).
  it('accepts and delivers emails sent at once, single and batched, over two server connections', async () => {
    const { token } = await createOrg(services);
    const send = (to: string) =>
      app.inject({ method: 'POST', url: '/api/v2/emails', headers: bearer(token), payload: { from: 'Acme <hello@acme.test>', to, subject: 'Hi', markdown: 'Hello' } });
    const singles = await Promise.all(Array.from({ length: 40 }, (_, i) => send(`single${i}@example.com`)));
    for (const res of singles) expect(res.statusCode, res.body).toBe(200);
    const batch = await app.inject({
      method: 'POST',
      url: '/api/v2/emails/batch',
      headers: bearer(token),
      payload: Array.from({ length: 60 }, (_, i) => ({ from: 'Acme <hello@acme.test>', to: `batch${i}@example.com`, subject: 'Hi', markdown: 'Hello' })),
    });
    expect(batch.statusCode, batch.body).toBe(200);
    const statuses = () => services.orm.em.fork().execute<{ status: string; n: number }[]>('select status, count(*)::int as n from emails group by status');
    expect(await until(statuses, (rows) => rows.length === 1 && rows[0]!.status === 'sent', 30_000)).toEqual([{ status: 'sent', n: 100 }]);
    expect(sink.accepted).toBe(100);
  });

  it('names no statement on the connection when turned off', async () => {
    const prepared = (em: typeof services.orm.em) =>
      withConnection(em, async (sql) => {
        // One transaction: PgBouncer keeps it on one server connection.
        await sql.query('begin');
        await sql.query('select 1 as one', [], 'mailroom_test_probe');
        const names = await sql.query<{ name: string }>('select name from pg_prepared_statements');
        await sql.query('commit');
        return names.map((r) => r.name);
      });
    // The same probe through `sqlOf`, inside a MikroORM transaction: the way the report reader
    // and the feedback recorder run their named statements.
    const preparedInOrmTransaction = (em: typeof services.orm.em) =>
      em.fork().transactional(async (tx) => {
        await sqlOf(tx).query('select 1 as one', [], 'mailroom_test_orm_probe');
        return (await sqlOf(tx).query<{ name: string }>('select name from pg_prepared_statements')).map((r) => r.name);
      });
    expect(await prepared(services.orm.em)).not.toContain('mailroom_test_probe');
    expect(await preparedInOrmTransaction(services.orm.em)).not.toContain('mailroom_test_orm_probe');
    // The same probes with the default (named statements on): the view does show them.
    const orm = await initOrm({ databaseUrl: env.config.databaseUrl });
    try {
      expect(await prepared(orm.em)).toContain('mailroom_test_probe');
      expect(await preparedInOrmTransaction(orm.em)).toContain('mailroom_test_orm_probe');
    } finally {
      await orm.close();
    }
  });
});

describe('ensureDatabase through a PgBouncer that serves every database (a wildcard entry)', () => {
  it('creates a missing database there', async () => {
    const name = `mailroom_test_bouncer_${Date.now().toString(36)}`;
    const url = new URL(env.config.databaseUrl);
    url.pathname = `/${name}`;
    try {
      expect(await ensureDatabase(bouncer.through(url.toString()))).toBe(true);
      expect(await ensureDatabase(bouncer.through(url.toString()))).toBe(false);
      // At once: no login to it failed before it existed (PgBouncer would hold the next one 15 s).
      const client = new pg.Client({ connectionString: bouncer.through(url.toString()), connectionTimeoutMillis: 3_000 });
      await client.connect();
      await client.end();
    } finally {
      await dropDatabase(name);
    }
  });
});

describe('migrate through a PgBouncer that serves only the application database', () => {
  it('finds the database there and applies the migrations, without the postgres database it does not serve', async () => {
    const name = new URL(env.config.databaseUrl).pathname.slice(1);
    const only = await startPgBouncer({ serverConnections: 2, databases: [name] });
    try {
      const url = only.through(env.config.databaseUrl);
      expect(await ensureDatabase(url)).toBe(false);
      const run = await runCli(['migrate'], { ...env.env, DATABASE_URL: url, DATABASE_PREPARED_STATEMENTS: 'false' });
      expect(run.code, run.stderr).toBe(0);
      expect(run.stderr).toContain('database is up to date');
    } finally {
      await only.stop();
    }
  });

  it('names the database itself when it is missing there (not the postgres database the pooler does not serve)', async () => {
    const missing = `mailroom_test_missing_${Date.now().toString(36)}`;
    const only = await startPgBouncer({ serverConnections: 2, databases: [missing] });
    try {
      const url = new URL(env.config.databaseUrl);
      url.pathname = `/${missing}`;
      await expect(ensureDatabase(only.through(url.toString()))).rejects.toThrow(new RegExp(missing));
    } finally {
      await only.stop();
    }
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { withConnection } from '../src/shared/db/sql.js';
import { holdLock } from './helpers/database.js';
import { initOrm, type Orm } from '../src/shared/db/orm.js';
import { keepPlannerStatistics, refreshPlannerStatistics } from '../src/shared/db/planner-statistics.js';
import { until } from './helpers/until.js';
import { claimEmails, insertEmailRows } from '../src/shared/emails/queries.js';
import type { NewEmail } from '../src/shared/emails/input.js';
import { newId } from '../src/shared/ids.js';
import { createLogger } from '../src/shared/logger.js';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';

// A prepared statement's generic plan, made while `emails` was nearly empty, is a sequential
// scan that PostgreSQL keeps as the table grows (the stall of a fresh installation under a
// burst). The worker's planner-statistics pass analyses the grown table, which replaces
// those plans. Measured on the claim itself, on one connection, by PostgreSQL's own count of
// sequential scans of `emails`.
describe('planner statistics of a table that grew', () => {
  let ctx: TestContext;
  let claimer: Orm;
  let organizationId: string;

  beforeAll(async () => {
    ctx = await createTestContext();
    organizationId = (await createOrg(ctx.services)).organizationId;
    // Autovacuum would analyse the table at a moment of its own and replace the plan first.
    await ctx.services.orm.em.fork().execute('alter table emails set (autovacuum_enabled = false)');
    // One connection: every claim below runs on the same backend, with its plan cache.
    claimer = await initOrm({ databaseUrl: ctx.env.config.databaseUrl, poolSize: 1 });
  });
  afterAll(async () => {
    await claimer.close(true);
    await ctx.close();
  });

  const emails = (n: number): NewEmail[] =>
    Array.from({ length: n }, (_, i) => ({ organizationId, from: 'news@acme.test', to: `reader${i}@example.com`, subject: 'Hello', contentKind: 'html', content: `<p>${'Hello reader. '.repeat(20)}</p>` }));
  const insert = async (n: number) => {
    for (let done = 0; done < n; done += 1_000) {
      const batch = emails(Math.min(1_000, n - done));
      await insertEmailRows(ctx.services.orm.em, batch, batch.map(() => newId('eml')));
    }
  };
  /** Sequential scans of `emails` made by the claimer's backend, flushed and read on it. */
  const seqScans = () =>
    withConnection(claimer.em, async (sql) => {
      await sql.query('select pg_stat_force_next_flush()');
      const [row] = await sql.query<{ n: string }>(`select seq_scan as n from pg_stat_user_tables where relname = 'emails'`);
      return Number(row!.n);
    });
  // Ids that match nothing: the claim changes no row, and its plan is the same.
  const claim = () => claimEmails(claimer.em, [newId('eml'), newId('eml')]);

  it('replaces the sequential-scan plan of the claim once the table has grown', async () => {
    await insert(5);
    // Five custom plans, then PostgreSQL settles on the generic one: all made on 5 rows.
    for (let i = 0; i < 8; i++) await claim();

    await insert(6_000);
    let before = await seqScans();
    await claim();
    await claim();
    // The hazard is real: the plan made on 5 rows reads the whole table on every claim.
    expect((await seqScans()) - before).toBe(2);

    const analysed = await refreshPlannerStatistics(ctx.services.orm, createLogger({ level: 'silent' }));
    expect(analysed.map((a) => a.table)).toContain('emails');
    before = await seqScans();
    for (let i = 0; i < 8; i++) await claim();
    expect((await seqScans()) - before).toBe(0);

    // Analysed now: nothing to do until the table grows fourfold again.
    expect((await refreshPlannerStatistics(ctx.services.orm, createLogger({ level: 'silent' }))).map((a) => a.table)).not.toContain('emails');
  });
});

describe('planner statistics pass: failures, and the timer of a worker process', () => {
  let ctx: TestContext;
  const sql = (text: string) => ctx.services.orm.em.fork().execute(text);
  /** A table of about 1 MB never analysed (autovacuum off for it): grown for the pass. */
  const grownTable = async (name: string, index?: string) => {
    await sql(`create table ${name} (a int, b text) with (autovacuum_enabled = false)`);
    // Before the rows: building an index sets the table's relpages, as an ANALYZE would.
    if (index) await sql(`create index on ${name} (${index})`);
    await sql(`insert into ${name} select g, repeat('x', 100) from generate_series(1, 10000) g`);
  };
  const relpages = async (name: string) => Number(((await sql(`select relpages from pg_class where relname = '${name}'`)) as { relpages: number }[])[0]!.relpages);
  const spyLogger = () => {
    const calls: { level: string; table?: string }[] = [];
    const at = (level: string) => (obj: { table?: string }) => void calls.push({ level, table: obj?.table });
    return { calls, logger: { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') } as unknown as ReturnType<typeof createLogger> };
  };

  beforeAll(async () => {
    ctx = await createTestContext();
    // ANALYZE evaluates this expression index over its sample: it fails while the setting is on.
    await sql(`create function probe_fail(a int) returns int immutable language plpgsql as $$
      begin if current_setting('mailroom.probe_fail', true) = 'on' then raise exception 'probe'; end if; return a; end $$`);
    await grownTable('grown_probe', '(probe_fail(a))');
  });
  afterAll(async () => ctx?.close());

  it('logs a lock not granted at debug level, any other failure of the ANALYZE as a warning', async () => {
    // Another session holds the table (as autovacuum would): the ANALYZE gives up after 1 s.
    const lock = await holdLock(ctx.services.orm.em, 'lock table grown_probe in share update exclusive mode');
    const waiting = spyLogger();
    try {
      expect((await refreshPlannerStatistics(ctx.services.orm, waiting.logger)).map((a) => a.table)).not.toContain('grown_probe');
    } finally {
      await lock.release();
    }
    expect(waiting.calls.filter((c) => c.table === 'grown_probe').map((c) => c.level)).toEqual(['debug']);

    // Any other error: the ANALYZE itself fails (on connections opened with the setting on).
    const [{ db }] = (await sql('select current_database() as db')) as { db: string }[];
    await sql(`alter database "${db}" set mailroom.probe_fail = 'on'`);
    const failing = await initOrm({ databaseUrl: ctx.env.config.databaseUrl, poolSize: 1 });
    try {
      const broken = spyLogger();
      expect((await refreshPlannerStatistics(failing, broken.logger)).map((a) => a.table)).not.toContain('grown_probe');
      expect(broken.calls.filter((c) => c.table === 'grown_probe').map((c) => c.level)).toEqual(['warn']);
    } finally {
      await failing.close(true);
      await sql(`alter database "${db}" reset mailroom.probe_fail`);
    }
    expect(await relpages('grown_probe')).toBe(0);
  });

  it('leaves alone a grown table the database user may not analyse (not its own)', async () => {
    // A database user that is not a superuser (the usual installation): PostgreSQL would skip
    // another owner's table with a warning on every pass, and the pass would report it analysed.
    const role = `mailroom_plain_${Date.now().toString(36)}`;
    await sql(`create role ${role} login`);
    await sql(`grant create, usage on schema public to ${role}`);
    const url = new URL(ctx.env.config.databaseUrl);
    url.username = role;
    const plain = await initOrm({ databaseUrl: url.toString(), poolSize: 1 });
    try {
      await plain.em.fork().execute(`create table grown_own (a int, b text) with (autovacuum_enabled = false)`);
      await plain.em.fork().execute(`insert into grown_own select g, repeat('x', 100) from generate_series(1, 10000) g`);
      await grownTable('grown_not_own');
      const analysed = (await refreshPlannerStatistics(plain, spyLogger().logger)).map((a) => a.table);
      expect(analysed).toContain('grown_own');
      expect(analysed).not.toContain('grown_not_own');
      expect(await relpages('grown_own')).toBeGreaterThan(0);
      expect(await relpages('grown_not_own')).toBe(0);
    } finally {
      await plain.close(true);
      await sql('drop table if exists grown_own, grown_not_own');
      await sql(`revoke all on schema public from ${role}`);
      await sql(`drop role ${role}`);
    }
  });

  it('runs every few seconds in a worker process until stopped', async () => {
    const keeper = keepPlannerStatistics(ctx.services.orm, createLogger({ level: 'silent' }), 20);
    try {
      await until(() => relpages('grown_probe'), (pages) => pages > 0, 10_000);
    } finally {
      await keeper.stop();
    }
    await grownTable('grown_after_stop');
    await new Promise((r) => setTimeout(r, 300));
    expect(await relpages('grown_after_stop')).toBe(0);
  });
});

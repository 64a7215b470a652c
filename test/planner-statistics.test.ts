import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { withConnection } from '../src/shared/db/sql.js';
import { initOrm, type Orm } from '../src/shared/db/orm.js';
import { refreshPlannerStatistics } from '../src/shared/db/planner-statistics.js';
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

describe('planner statistics pass: errors', () => {
  // A catalog that reports one grown table, and a connection whose ANALYZE fails with `code`.
  const failingOrm = (code: string) => {
    const connection = {
      query: async (text: string | { text: string }) => {
        const sqlText = typeof text === 'string' ? text : text.text;
        if (sqlText.startsWith('analyze')) throw Object.assign(new Error('analyze failed'), { code });
        if (sqlText.includes('pg_try_advisory_xact_lock')) return { rows: [{ locked: true }] };
        return { rows: [] };
      },
    };
    const em = {
      execute: async () => [{ table: 'emails', pages_then: 0, pages_now: '100' }],
      getKnex: () => ({ client: { acquireConnection: async () => connection, releaseConnection: async () => {} } }),
    };
    return { em } as unknown as Orm;
  };
  const spyLogger = () => {
    const calls: { level: string; msg: string }[] = [];
    const at = (level: string) => (_obj: unknown, msg: string) => void calls.push({ level, msg });
    return { calls, logger: { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') } as unknown as ReturnType<typeof createLogger> };
  };

  it('logs a lock not granted at debug level, any other failure of the ANALYZE as a warning', async () => {
    const locked = spyLogger();
    expect(await refreshPlannerStatistics(failingOrm('55P03'), locked.logger)).toEqual([]);
    expect(locked.calls.map((c) => c.level)).toEqual(['debug']);

    const broken = spyLogger();
    expect(await refreshPlannerStatistics(failingOrm('XX000'), broken.logger)).toEqual([]);
    expect(broken.calls.map((c) => c.level)).toEqual(['warn']);
  });
});

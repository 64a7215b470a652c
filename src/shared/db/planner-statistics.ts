import type { Orm } from './orm.js';
import { analyzeTable, grownTables, type GrownTable } from './queries.js';
import type { Logger } from '../logger.js';

// A table is analysed once it is this many times larger than at its last ANALYZE or VACUUM...
const GROWTH_FACTOR = 4;
// ...counting a never-analysed table as this many pages: the first ANALYZE comes at 512 KiB.
const MIN_PAGES = 16;
// Past 1 GiB a table's plans were made on a large table already, and autovacuum keeps up.
const MAX_PAGES = 131_072;
const LOCK_TIMEOUT_MS = 1_000;
const CHECK_EVERY_MS = 5_000;

/**
 * Planner statistics of fast-growing tables (docs/operations.md "Planner statistics").
 *
 * The hot statements of the send path are prepared once per connection (`db/sql.ts`), and
 * PostgreSQL keeps a prepared statement's generic plan until the statistics of its tables
 * change. A plan made while `emails` was nearly empty (a fresh installation, its first
 * emails) is a sequential scan, and it stays one while a burst grows the table to hundreds of
 * thousands of rows: every claim of a few ids then reads the whole table (40 ms for 2 ids at
 * 200,000 rows), and delivery falls to tens of emails a second until autovacuum gets to the
 * table, which can take minutes on a busy new database. An ANALYZE invalidates those plans
 * in every backend, and the next ones are made for the table's real size.
 *
 * So a table that has grown `GROWTH_FACTOR` times since its last ANALYZE (or VACUUM) is
 * analysed now: at 512 KiB, 2 MiB, 8 MiB and so on up to 1 GiB, a handful of times in a
 * table's life, each reading a sample of 30,000 rows at most.
 */
export async function refreshPlannerStatistics(orm: Orm, logger: Logger): Promise<GrownTable[]> {
  const analysed: GrownTable[] = [];
  // An ANALYZE that runs sets relpages: the table is not found again until it grows as much once
  // more (grownTables lists only tables the database user may analyse).
  for (const grown of await grownTables(orm.em, { factor: GROWTH_FACTOR, minPages: MIN_PAGES, maxPages: MAX_PAGES })) {
    try {
      if (!(await analyzeTable(orm.em, grown.table, LOCK_TIMEOUT_MS))) continue;
    } catch (error) {
      // The next pass tries again. A lock not granted in time (55P03: autovacuum on the
      // table) is routine; any other error is not, and is not hidden at debug level.
      if ((error as { code?: unknown }).code === '55P03') logger.debug({ err: error, table: grown.table }, 'table not analysed yet');
      else logger.warn({ err: error, table: grown.table }, 'table not analysed; trying again');
      continue;
    }
    logger.info({ table: grown.table, pagesThen: grown.pagesThen, pagesNow: grown.pagesNow }, 'table grew: planner statistics gathered again');
    analysed.push(grown);
  }
  return analysed;
}

/**
 * `refreshPlannerStatistics` every few seconds in a worker process, one pass at a time; a
 * failure (PostgreSQL down, a lock not granted) is logged and the next pass tries again.
 */
export function keepPlannerStatistics(orm: Orm, logger: Logger, everyMs = CHECK_EVERY_MS): { stop(): Promise<void> } {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let stopped = false;
  const pass = () => {
    running = refreshPlannerStatistics(orm, logger)
      .then(
        () => undefined,
        (error: unknown) => logger.warn({ err: error }, 'planner statistics not refreshed; trying again'),
      )
      .finally(() => {
        running = undefined;
        if (!stopped) schedule();
      });
  };
  const schedule = () => {
    timer = setTimeout(pass, everyMs);
    timer.unref();
  };
  schedule();
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running;
    },
  };
}

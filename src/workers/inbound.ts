import { processReports } from '../shared/bounces/process.js';
import { purgeReports, unreadReportIds } from '../shared/bounces/queries.js';
import { defineProcessor } from './runner.js';

// A report still unread this long after it arrived has lost its job (Redis restarted empty).
const RECONCILE_GRACE_MS = 60_000;
const RECONCILE_BATCH = 1_000;
const REQUEUE_BATCH = 100;
// Read reports are kept this long for the operator to look at, then deleted in batches.
const KEEP_READ_REPORTS_MS = 30 * 24 * 3600 * 1000;
const PURGE_BATCH = 5_000;

/**
 * Bounces and complaints received by mail (docs/outcomes.md "Bounces and complaints by mail"): each
 * stored report is read and applied once (src/shared/bounces/process.ts).
 */
export const inboundProcessor = defineProcessor({
  queue: 'inbound',
  concurrency: 8,
  handlers: {
    process: async ({ reportIds }, ctx) => {
      const outcomes = await processReports(ctx.em, reportIds, {
        bounceDomain: ctx.services.config.inbound.bounceDomain,
        metrics: ctx.services.metrics,
        now: ctx.services.clock(),
      });
      for (const [reportId, outcome] of outcomes) {
        if (outcome.verdict.type === 'ignored') ctx.log.info({ reportId, emailId: outcome.emailId, reason: outcome.verdict.reason }, 'inbound report ignored');
      }
      return { read: outcomes.size };
    },
    reconcile: async (_payload, ctx) => {
      const now = ctx.services.clock().getTime();
      const ids = await unreadReportIds(ctx.em, new Date(now - RECONCILE_GRACE_MS), RECONCILE_BATCH);
      // A report whose job still exists may be read by both: the second finds it read. The job
      // id names this run: a failed job is kept (removeOnFail, 7 days), and an id made of the
      // first report alone made every later run's add a no-op for the oldest reports, unread.
      for (let i = 0; i < ids.length; i += REQUEUE_BATCH) {
        const chunk = ids.slice(i, i + REQUEUE_BATCH);
        await ctx.services.producer.add('inbound', { name: 'process', data: { reportIds: chunk }, jobId: `requeue-${chunk[0]}-${now}` });
      }
      const purged = await purgeReports(ctx.em, new Date(now - KEEP_READ_REPORTS_MS), PURGE_BATCH);
      return { requeued: ids.length, purged };
    },
  },
  async onStart(services) {
    await services.producer.queue('inbound').upsertJobScheduler('inbound-reconcile', { every: 60_000 }, { name: 'reconcile', data: {} });
  },
});

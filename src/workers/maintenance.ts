import { purgeExpired } from '../shared/retention/purge.js';
import { defineProcessor } from './runner.js';

/** Housekeeping that belongs to no single feature. Features add their purges here. */
export const maintenanceProcessor = defineProcessor({
  queue: 'maintenance',
  concurrency: 1,
  handlers: {
    // Retention (docs/operations.md): batches of a few thousand rows, each its
    // own short statement. A backlog larger than one run's budget continues at once in a
    // follow-up job rather than holding this one (and a worker's shutdown) for long.
    'purge-expired': async (_payload, ctx) => {
      const result = await purgeExpired(ctx.em, ctx.services.config);
      const total = Object.values(result.purged).reduce((a, b) => a + b, 0);
      if (total > 0) ctx.log.info({ purged: result.purged, more: result.more }, 'purged expired rows');
      if (result.more) {
        await ctx.services.producer.add('maintenance', { name: 'purge-expired', data: {}, jobId: `purge-expired-more-${Date.now()}` });
      }
      return result;
    },
  },
  async onStart(services) {
    // One scheduler for every worker process: upsert is idempotent by id.
    await services.producer.queue('maintenance').upsertJobScheduler('purge-expired', { every: 3_600_000 }, { name: 'purge-expired', data: {} });
  },
});

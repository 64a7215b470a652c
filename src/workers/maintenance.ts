import { defineProcessor } from './runner.js';

/** Housekeeping that belongs to no single feature. Features add their purges here. */
export const maintenanceProcessor = defineProcessor({
  queue: 'maintenance',
  concurrency: 1,
  handlers: {
    'purge-expired': async (_payload, ctx) => {
      ctx.log.debug('nothing to purge yet');
      return { purged: 0 };
    },
  },
  async onStart(services) {
    // One scheduler for every worker process: upsert is idempotent by id.
    await services.producer.queue('maintenance').upsertJobScheduler('purge-expired', { every: 3_600_000 }, { name: 'purge-expired', data: {} });
  },
});

import { purgeWebhookDeliveries, WEBHOOK_DELIVERY_RETENTION_MS } from '../shared/webhooks/service.js';
import { defineProcessor } from './runner.js';

/** Housekeeping that belongs to no single feature. Features add their purges here. */
export const maintenanceProcessor = defineProcessor({
  queue: 'maintenance',
  concurrency: 1,
  handlers: {
    'purge-expired': async (_payload, ctx) => {
      const webhookDeliveries = await purgeWebhookDeliveries(ctx.em, new Date(ctx.services.clock().getTime() - WEBHOOK_DELIVERY_RETENTION_MS));
      return { purged: webhookDeliveries, webhookDeliveries };
    },
  },
  async onStart(services) {
    // One scheduler for every worker process: upsert is idempotent by id.
    await services.producer.queue('maintenance').upsertJobScheduler('purge-expired', { every: 3_600_000 }, { name: 'purge-expired', data: {} });
  },
});

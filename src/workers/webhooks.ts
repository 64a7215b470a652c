import type { Services } from '../shared/container.js';
import { deliverEndpoint, type EndpointRunOptions } from '../shared/webhooks/dispatcher.js';
import { endpointsWithDueMessages } from '../shared/webhooks/queries.js';
import { defineProcessor, type QueueProcessor } from './runner.js';

export interface WebhookProcessorOptions {
  /** Endpoints served at once by one worker process (one job each). */
  concurrency?: number;
  /** How often the dispatcher looks for due messages. */
  dispatchEveryMs?: number;
  run?: EndpointRunOptions;
}

const DEFAULTS = { concurrency: 64, dispatchEveryMs: 1_000 };
// Endpoints enqueued by one dispatcher run; the next run (a second later) takes the rest.
const DISPATCH_LIMIT = 5_000;
// A `deliver` job leaves nothing to keep: removed at once, so that the next dispatch can add
// the endpoint's job again under the same id.
const DELIVER_JOB_OPTIONS = { removeOnComplete: true, removeOnFail: true };

/**
 * The `webhooks` queue. `dispatch` runs every second on a job scheduler: it is both the
 * outbox's dispatcher and its reconciler, since it reads PostgreSQL (the outbox) and not
 * Redis: a message whose job was lost (a worker killed, Redis flushed) is found by the next
 * run like a new one. `deliver` posts one endpoint's due messages (dispatcher.ts).
 */
export function webhookProcessor(options: WebhookProcessorOptions = {}): QueueProcessor<'webhooks'> {
  const o = { ...DEFAULTS, ...options };
  return defineProcessor({
    queue: 'webhooks',
    concurrency: o.concurrency,
    handlers: {
      deliver: async (payload, ctx) =>
        deliverEndpoint(
          { em: ctx.em, box: ctx.services.box, client: ctx.services.webhookClient, clock: ctx.services.clock, log: ctx.log },
          payload.endpointId,
          o.run,
        ),
      dispatch: async (_payload, ctx) => {
        const ids = await endpointsWithDueMessages(ctx.em, DISPATCH_LIMIT);
        await ctx.services.producer.addBulk(
          'webhooks',
          ids.map((endpointId) => ({ name: 'deliver' as const, data: { endpointId }, jobId: `deliver-${endpointId}`, opts: DELIVER_JOB_OPTIONS })),
        );
        return { dispatched: ids.length };
      },
    },
    async onStart(services) {
      await installDispatch(services, o.dispatchEveryMs);
    },
  });
}

function installDispatch(services: Services, everyMs: number) {
  return services.producer
    .queue('webhooks')
    .upsertJobScheduler('webhooks-dispatch', { every: everyMs }, { name: 'dispatch', data: {}, opts: { removeOnComplete: true, removeOnFail: 100 } });
}

export const webhooksProcessor = webhookProcessor();

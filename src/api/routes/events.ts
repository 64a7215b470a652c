import { z } from 'zod';
import { recordRevenueEvent, REVENUE_EVENTS } from '../../shared/subscribers/events.js';
import type { App } from '../types.js';

const EventBody = z.object({
  eventType: z.enum(REVENUE_EVENTS),
  subscriber: z.string().trim().min(1).describe('A subscriber id or an email address'),
  data: z
    .object({
      amount: z.number().int('must be an integer number of cents').min(0).max(Number.MAX_SAFE_INTEGER),
      currency: z.string().min(1).max(16).optional(),
    })
    .loose()
    .describe('amount in integer cents; further keys are kept'),
});

/** docs/audience.md "Events": payments and refunds (permission `subscribers`; invalid input is 400). */
export async function eventsRoutes(app: App): Promise<void> {
  app.post(
    '/events',
    {
      config: { permission: 'subscribers', validationStatus: 400 },
      schema: {
        tags: ['subscribers'],
        summary: 'Record a payment or a refund on a subscriber',
        body: EventBody,
        response: { 200: z.object({ id: z.string(), eventType: z.enum(REVENUE_EVENTS) }) },
      },
    },
    async (request) => recordRevenueEvent(request.em, request.caller.organizationId, request.body, app.services.clock()),
  );
}

import { EntitySchema } from '@mikro-orm/core';

/**
 * Something that happened to a subscriber: a payment or refund (docs/audience.md "Events",
 * `data.amount` in cents) or workflow activity recorded by the workflows worker
 * (`subscriber.tag_added`, ...).
 */
export class SubscriberEvent {
  id!: string;
  organizationId!: string;
  subscriberId!: string;
  eventType!: string;
  data: Record<string, unknown> = {};
  createdAt: Date = new Date();
}

export const SubscriberEventSchema = new EntitySchema<SubscriberEvent>({
  class: SubscriberEvent,
  tableName: 'subscriber_events',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    subscriberId: { type: 'string' },
    eventType: { type: 'text' },
    data: { type: 'json' },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
  },
});

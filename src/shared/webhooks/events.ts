/** The event types an endpoint may subscribe to (docs/webhooks.md "Event types"), in the order of the docs. */
export const WEBHOOK_EVENT_TYPES = [
  'email.sent',
  'email.delivered',
  'email.delivery_delayed',
  'email.bounced',
  'email.complained',
  'email.opened',
  'email.clicked',
  'email.failed',
  'contact.created',
  'contact.updated',
  'contact.unsubscribed',
  'campaign.sent',
  'domain.verified',
  'domain.failed',
] as const;

export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number];

/** Sent only by `POST /webhooks/{id}/test`, to that endpoint, whatever it subscribed to. */
export const TEST_EVENT_TYPE = 'webhook.test';

export function isWebhookEventType(value: string): value is WebhookEventType {
  return (WEBHOOK_EVENT_TYPES as readonly string[]).includes(value);
}

import type { DeliveryStatus, EmailStatus } from '../db/entities/email.js';

export const LAST_EVENTS = ['queued', 'sent', 'delivered', 'opened', 'clicked', 'bounced', 'complained', 'failed'] as const;
export type LastEvent = (typeof LAST_EVENTS)[number];

export interface LastEventColumns {
  status: EmailStatus;
  deliveryStatus: DeliveryStatus | null;
  firstOpenedAt: Date | null;
  firstClickedAt: Date | null;
}

/**
 * The one place `last_event` is derived: clicked > opened > the provider's
 * delivery status (bounced, complained, delivered) > the send status (failed, sent,
 * queued). A row being handed over right now (`sending`) still reads `queued`.
 */
export function lastEvent(email: LastEventColumns): LastEvent {
  if (email.firstClickedAt) return 'clicked';
  if (email.firstOpenedAt) return 'opened';
  if (email.deliveryStatus) return email.deliveryStatus;
  if (email.status === 'failed') return 'failed';
  if (email.status === 'sent') return 'sent';
  return 'queued';
}

/**
 * The rows whose `lastEvent` is `event`, as a MikroORM filter: the same order of
 * precedence as `lastEvent`, written for the database.
 */
export function lastEventFilter(event: LastEvent): Record<string, unknown> {
  switch (event) {
    case 'clicked':
      return { firstClickedAt: { $ne: null } };
    case 'opened':
      return { firstClickedAt: null, firstOpenedAt: { $ne: null } };
    case 'delivered':
    case 'bounced':
    case 'complained':
      return { firstClickedAt: null, firstOpenedAt: null, deliveryStatus: event };
    case 'failed':
    case 'sent':
      return { firstClickedAt: null, firstOpenedAt: null, deliveryStatus: null, status: event };
    case 'queued':
      return { firstClickedAt: null, firstOpenedAt: null, deliveryStatus: null, status: { $nin: ['failed', 'sent'] } };
  }
}

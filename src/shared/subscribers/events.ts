import type { EntityManager } from '@mikro-orm/postgresql';
import { assertOneCursor, pageOf } from '../db/cursor.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import { normalizeEmail } from './input.js';
import * as q from './queries.js';
import { findSubscriberRow } from './service.js';

export const REVENUE_EVENTS = ['SUBSCRIBER_PAYMENT', 'SUBSCRIBER_REFUND'] as const;
export type RevenueEventType = (typeof REVENUE_EVENTS)[number];

export interface RevenueEventInput {
  eventType: RevenueEventType;
  /** An id or an address. */
  subscriber: string;
  /** `amount` in integer cents, optional `currency`, further keys kept as given. */
  data: { amount: number; currency?: string } & Record<string, unknown>;
}

/**
 * docs/audience.md "Events": records the event and moves the subscriber's revenue by the amount (a
 * refund subtracts it) in one statement, so concurrent events never lose an update.
 */
export async function recordRevenueEvent(
  em: EntityManager,
  organizationId: string,
  input: RevenueEventInput,
  now: Date,
): Promise<{ id: string; eventType: RevenueEventType }> {
  const delta = input.eventType === 'SUBSCRIBER_REFUND' ? -input.data.amount : input.data.amount;
  const byId = isId(input.subscriber, 'sub');
  const id = newId('evt');
  const inserted = await q.insertRevenueEvent(em, {
    id,
    organizationId,
    by: byId ? 'id' : 'email',
    subscriber: byId ? input.subscriber : normalizeEmail(input.subscriber),
    delta,
    eventType: input.eventType,
    data: input.data,
    now,
  });
  if (!inserted) {
    const subscriber = await findSubscriberRow(em, organizationId, input.subscriber);
    if (!subscriber) throw new NotFoundError(`No subscriber ${input.subscriber}`);
    // Refused, not stored: a revenue past 2^53 - 1 cents could no longer be read back exactly.
    const message = `would take the subscriber's revenue (${subscriber.revenue} cents) past ${input.eventType === 'SUBSCRIBER_REFUND' ? '-' : ''}${q.MAX_REVENUE} cents`;
    throw new ValidationError(`data.amount: ${message}`, [{ path: 'data.amount', message }], 400);
  }
  return { id, eventType: input.eventType };
}

export interface SubscriberEventItem {
  id: string;
  eventType: string;
  data: Record<string, unknown>;
  createdAt: Date;
}

/** Payments, refunds and recorded workflow activity of one subscriber, newest first. */
export async function listSubscriberEvents(
  em: EntityManager,
  organizationId: string,
  ref: string,
  query: { limit: number; after?: string; before?: string },
): Promise<{ items: SubscriberEventItem[]; hasMore: boolean }> {
  assertOneCursor(query);
  const subscriber = await findSubscriberRow(em, organizationId, ref);
  if (!subscriber) throw new NotFoundError(`No subscriber ${ref}`);
  const found = await q.selectSubscriberEvents(em, subscriber.id, { after: query.after, before: query.before, limit: query.limit + 1 });
  const { items, hasMore } = pageOf(found, query.limit, query.before !== undefined);
  return {
    items: items.map((r) => ({ id: r.id, eventType: r.event_type, data: r.data, createdAt: new Date(r.created_at) })),
    hasMore,
  };
}

/** Idempotent by event id: the workflows worker may run a job twice. */
export async function recordActivity(
  em: EntityManager,
  event: { id: string; organizationId: string; subscriberId: string; eventType: string; data: Record<string, unknown>; createdAt: Date },
): Promise<boolean> {
  return q.insertActivity(em, event);
}

import type { EntityManager } from '@mikro-orm/postgresql';
import { NotFoundError } from '../errors.js';
import { isId, newId } from '../ids.js';
import { normalizeEmail } from './input.js';
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
 * Spec 4.17: records the event and moves the subscriber's revenue by the amount (a refund
 * subtracts it) in one statement, so concurrent events never lose an update.
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
  const inserted = (await em.execute(
    `with s as (
       update subscribers set revenue = revenue + ?, updated_at = ?
        where organization_id = ? and ${byId ? 'id' : 'email'} = ?
       returning id)
     insert into subscriber_events (id, organization_id, subscriber_id, event_type, data, created_at)
     select ?, ?, s.id, ?, ?::jsonb, ? from s returning id`,
    [delta, now, organizationId, byId ? input.subscriber : normalizeEmail(input.subscriber), id, organizationId, input.eventType, JSON.stringify(input.data), now],
  )) as Array<{ id: string }>;
  if (!inserted[0]) throw new NotFoundError(`No subscriber ${input.subscriber}`);
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
  q: { limit: number; after?: string },
): Promise<{ items: SubscriberEventItem[]; hasMore: boolean }> {
  const subscriber = await findSubscriberRow(em, organizationId, ref);
  if (!subscriber) throw new NotFoundError(`No subscriber ${ref}`);
  const params: unknown[] = [subscriber.id];
  let after = '';
  if (q.after) {
    after = ' and id < ?';
    params.push(q.after);
  }
  const found = (await em.execute(
    `select id, event_type, data, created_at from subscriber_events where subscriber_id = ?${after} order by id desc limit ?`,
    [...params, q.limit + 1] as never[],
  )) as Array<{ id: string; event_type: string; data: Record<string, unknown>; created_at: Date }>;
  const hasMore = found.length > q.limit;
  return {
    items: found.slice(0, q.limit).map((r) => ({ id: r.id, eventType: r.event_type, data: r.data, createdAt: new Date(r.created_at) })),
    hasMore,
  };
}

/** Idempotent by event id: the workflows worker may run a job twice. */
export async function recordActivity(
  em: EntityManager,
  event: { id: string; organizationId: string; subscriberId: string; eventType: string; data: Record<string, unknown>; createdAt: Date },
): Promise<boolean> {
  const inserted = (await em.execute(
    `insert into subscriber_events (id, organization_id, subscriber_id, event_type, data, created_at)
     select ?, ?, s.id, ?, ?::jsonb, ? from subscribers s where s.id = ? and s.organization_id = ?
     on conflict (id) do nothing returning id`,
    [event.id, event.organizationId, event.eventType, JSON.stringify(event.data), event.createdAt, event.subscriberId, event.organizationId] as never[],
  )) as unknown[];
  return inserted.length > 0;
}

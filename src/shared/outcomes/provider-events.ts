import type { EntityManager } from '@mikro-orm/postgresql';
import { z } from 'zod';
import { bareAddress, bareAddresses } from '../bounces/fields.js';
import { aboutRecipient } from '../bounces/verdict.js';
import { NotFoundError } from '../errors.js';
import { storableText } from '../storable.js';
import type { Metrics } from '../metrics.js';
import { historyKey } from '../verification/history.js';
import { toRecord } from '../subscribers/rows.js';
import { tagsOf } from '../subscribers/service.js';
import { recordContactEvents, recordEmailEvents } from '../webhooks/queries.js';
import {
  deliveryEventKey,
  insertDeliveryEvents,
  insertSuppressions,
  lockEmailByMessageId,
  lockEmails,
  setDeliveryStatuses,
  setSubscribersBounced,
  upsertHistory,
  type FeedbackEmail,
  type HistoryOutcomes,
  type NewDeliveryEvent,
} from './queries.js';

/** docs/outcomes.md "Provider webhook": the body of `POST /webhooks/provider`. */
export const ProviderEventBody = z.strictObject({
  type: z.enum(['delivered', 'bounced', 'complained']),
  messageId: z
    .string()
    .min(1)
    .max(998)
    .transform((v) => v.trim().replace(/^<(.*)>$/, '$1'))
    .describe('The Message-ID of the email, with or without angle brackets'),
  bounceType: z.enum(['hard', 'soft']).optional().describe('For bounced: hard (permanent) or soft; default hard'),
  diagnostic: z.string().max(2_000).optional().describe('The remote server answer, e.g. "550 5.1.1 user unknown"'),
});
export type ProviderEvent = z.infer<typeof ProviderEventBody>;

/**
 * Precedence of delivery statuses (docs/outcomes.md): a status only moves up this ladder,
 * so events arriving late, out of order or replayed never move an email back. A bounce
 * after delivery (an asynchronous DSN) and a complaint after delivery both win.
 */
const RANK: Record<string, number> = { delivered: 1, bounced: 2, complained: 3 };
const rank = (status: string | null | undefined) => (status ? (RANK[status] ?? 0) : 0);

/** What happened to a message, as any source of delivery feedback reports it. */
export type ProviderOutcome = 'delivered' | 'bounced' | 'complained' | 'delivery_delayed';

/**
 * One delivery event, whatever its source: the generic webhook `POST /webhooks/provider`
 * (docs/outcomes.md), a provider's webhook (src/shared/providers) or a bounce report by mail. The
 * email is found by the Message-ID mailroom set or, where a relay replaced it, by the id the relay
 * gave at hand-over.
 */
export interface DeliveryFeedback {
  type: ProviderOutcome;
  /** The Message-ID mailroom set, without angle brackets. */
  messageId?: string | undefined;
  /** The relay's own id of the message (`emails.provider_message_id`). */
  providerMessageId?: string | undefined;
  /** For bounced: hard (permanent) or soft; default hard. */
  bounceType?: 'hard' | 'soft' | undefined;
  diagnostic?: string | undefined;
  /**
   * The recipient the event is about, as the provider names it. The email's `to`, or one of its
   * copies (cc, bcc: the event then acts on that address and leaves the email's status, as a
   * report by mail does); on an email with copies, an address that is neither makes the event
   * ignored. Absent (the generic webhook), or the email has no copies: the email's `to`.
   */
  recipient?: string | undefined;
}

export interface ProviderEventResult {
  emailId: string;
  /** False when the event was a replay or lower in precedence than the current status. */
  changed: boolean;
}

/** One event of a batch (`applyFeedbackBatch`), its email already known by id. */
export interface FeedbackItem {
  emailId: string;
  type: ProviderOutcome;
  bounceType?: 'hard' | 'soft' | undefined;
  diagnostic?: string | undefined;
  /**
   * The copy recipient (`cc`, `bcc`; bare, lower-cased) the event is about; absent: the
   * email's `to`. A copy's event suppresses and records that address and leaves the email's
   * status, which follows its `to` (docs/outcomes.md).
   */
  copy?: string | undefined;
}

export interface FeedbackResult extends ProviderEventResult {
  /** The event was recorded now (not a replay): it counts in the metrics. */
  fresh: boolean;
}

/** Message-IDs are compared without angle brackets and surrounding space. */
export function bareMessageId(value: string): string {
  return value.trim().replace(/^<(.*)>$/, '$1').trim();
}

/**
 * Records the events of a batch in the caller's transaction, their emails' rows locked by
 * the caller (`lockEmails`, `lockEmailByMessageId`): one statement a table whatever the
 * batch size (events, webhook outbox, statuses, suppressions, subscribers, verification
 * history). Every write is idempotent, so a replay changes nothing, and the items are
 * applied as if one after the other: `changed` says whether an item moved its email's
 * status, `fresh` whether its event row is new. A hard bounce or a complaint suppresses the
 * address in the email's organization, marks that organization's subscriber BOUNCED /
 * COMPLAINED and feeds the global verification history (docs/outcomes.md "Provider webhook",
 * docs/verification.md "History"); a delay is an event that moves no status. Undefined for an item
 * whose email is not in `emails`.
 */
async function recordFeedback(tx: EntityManager, emails: ReadonlyMap<string, FeedbackEmail>, items: readonly FeedbackItem[], now: Date): Promise<(FeedbackResult | undefined)[]> {
  const events: NewDeliveryEvent[] = [];
  // The event written for each key (email, type, recipient), and the item it came from.
  const eventOf = new Map<string, { i: number; event: NewDeliveryEvent }>();
  const status = new Map<string, string | null>();
  const changedEmails = new Set<string>();
  const suppressions = new Map<string, { organizationId: string; address: string; reason: 'hard_bounce' | 'complaint'; emailId: string }>();
  const subscribers = new Map<string, { organizationId: string; address: string; status: 'BOUNCED' | 'COMPLAINED' }>();
  const history = new Map<string, HistoryOutcomes>();
  const recordHistory = (address: string, column: 'hard_bounced_at' | 'complained_at' | 'mailbox_full_at' | 'mailbox_not_found_at' | 'proven_at') => {
    const key = historyKey(address);
    let row = history.get(key.email);
    if (!row) {
      row = { ...key, hard_bounced_at: null, complained_at: null, mailbox_full_at: null, mailbox_not_found_at: null, proven_at: null };
      history.set(key.email, row);
    }
    row[column] = now;
  };

  // A diagnostic is the remote server's words, whatever the source: kept (its first 2,000
  // characters), made storable after the cut, which may split a surrogate pair (a NUL or a lone
  // surrogate failed every write of the batch, on every retry).
  items = items.map((item) => (item.diagnostic === undefined ? item : { ...item, diagnostic: storableText(item.diagnostic.slice(0, 2_000)) }));
  const planned = items.map((item, i) => {
    const email = emails.get(item.emailId);
    if (!email) return undefined;
    const bounceType = item.type === 'bounced' ? (item.bounceType ?? 'hard') : undefined;
    const details = {
      ...(bounceType ? { bounceType } : {}),
      ...(item.diagnostic ? { diagnostic: item.diagnostic } : {}),
      ...(item.copy ? { recipient: item.copy } : {}),
    };
    const key = deliveryEventKey(email.id, item.type, item.copy);
    const earlier = eventOf.get(key);
    if (!earlier) {
      const event = { emailId: email.id, organizationId: email.organization_id, type: item.type, details };
      eventOf.set(key, { i, event });
      events.push(event);
    } else if (bounceType === 'hard' && earlier.event.details.bounceType === 'soft') {
      // A hard bounce after a soft one in the same batch: the hard one is the event, as across batches (insertDeliveryEvents).
      earlier.i = i;
      earlier.event.details = details;
    }
    let changed = false;
    if (!item.copy && item.type !== 'delivery_delayed') {
      const current = status.has(email.id) ? status.get(email.id) : email.delivery_status;
      if (rank(item.type) > rank(current)) {
        changed = true;
        status.set(email.id, item.type);
        changedEmails.add(email.id);
      }
    }
    const address = item.copy ?? email.address;
    if (item.type === 'complained' || bounceType === 'hard') {
      const complaint = item.type === 'complained';
      const at = `${email.organization_id} ${address}`;
      if (!suppressions.has(at)) suppressions.set(at, { organizationId: email.organization_id, address, reason: complaint ? 'complaint' : 'hard_bounce', emailId: email.id });
      // A complaint is the stronger statement.
      if (complaint || !subscribers.has(at)) subscribers.set(at, { organizationId: email.organization_id, address, status: complaint ? 'COMPLAINED' : 'BOUNCED' });
      recordHistory(address, complaint ? 'complained_at' : 'hard_bounced_at');
    }
    // The provider's word that the mailbox took the message: trusted evidence for the global
    // history (opens and clicks are not: docs/security.md).
    if (item.type === 'delivered') recordHistory(address, 'proven_at');
    if (item.type === 'bounced' && item.diagnostic) {
      // The remote answer's enhanced status code says more than hard/soft (RFC 3463).
      if (/\b5\.1\.1\b/.test(item.diagnostic)) recordHistory(address, 'mailbox_not_found_at');
      else if (/\b[45]\.2\.2\b/.test(item.diagnostic)) recordHistory(address, 'mailbox_full_at');
    }
    return { i, key, email, bounceType, changed };
  });

  const inserted = await insertDeliveryEvents(tx, events, now);
  const fresh = (p: NonNullable<(typeof planned)[number]>) => eventOf.get(p.key)?.i === p.i && inserted.has(p.key);
  // Customer webhooks (docs/webhooks.md) for the new events of the `to`, one statement a type.
  const hooks = new Map<ProviderOutcome, { emailId: string; extra?: Record<string, unknown> }[]>();
  for (const p of planned) {
    if (!p || !fresh(p) || items[p.i]!.copy) continue;
    const item = items[p.i]!;
    const list = hooks.get(item.type) ?? [];
    list.push({ emailId: p.email.id, ...(p.bounceType ? { extra: { bounce: { type: p.bounceType, diagnostic: item.diagnostic ?? null } } } : {}) });
    hooks.set(item.type, list);
  }
  for (const [type, list] of hooks) await recordEmailEvents(tx, `email.${type}`, list);
  await setDeliveryStatuses(tx, [...changedEmails].map((id) => ({ id, status: status.get(id)! })));
  await insertSuppressions(tx, [...suppressions.values()], now);
  // A status a subscriber took from the feedback is a change of the contact (docs/webhooks.md).
  const changedSubscribers = await setSubscribersBounced(tx, [...subscribers.values()], now);
  if (changedSubscribers.length > 0) {
    const tags = await tagsOf(tx, changedSubscribers.map((s) => s.id));
    await recordContactEvents(tx, 'contact.updated', changedSubscribers.map((s) => toRecord(s, tags.get(s.id) ?? [])));
  }
  await upsertHistory(tx, [...history.values()], now);
  return planned.map((p) => (p ? { emailId: p.email.id, changed: p.changed, fresh: fresh(p) } : undefined));
}

/** The metrics of recorded events: first occurrences of the `to`'s events only. */
export function countFeedback(metrics: Metrics | undefined, items: readonly FeedbackItem[], results: readonly (FeedbackResult | undefined)[]): void {
  if (!metrics) return;
  items.forEach((item, i) => {
    if (!results[i]?.fresh || item.copy) return;
    if (item.type === 'delivered') metrics.emailsDelivered.inc();
    else if (item.type === 'bounced') metrics.emailsBounced.inc({ type: item.bounceType ?? 'hard' });
    else if (item.type === 'complained') metrics.emailsComplained.inc();
  });
}

/**
 * Applies a batch of events whose emails are known by id (the bounce reports by mail), in
 * the caller's transaction: the emails are locked in id order, then `recordFeedback`. The
 * caller counts the metrics (`countFeedback`) once its transaction has committed.
 */
export async function applyFeedbackBatch(tx: EntityManager, items: readonly FeedbackItem[], now: Date): Promise<(FeedbackResult | undefined)[]> {
  if (items.length === 0) return [];
  const emails = await lockEmails(tx, [...new Set(items.map((i) => i.emailId))]);
  return recordFeedback(tx, new Map(emails.map((e) => [e.id, e])), items, now);
}

/**
 * Applies one delivery event in one transaction (the provider webhooks); undefined when no
 * email matches (the caller decides whether that is an error).
 */
export async function applyDeliveryFeedback(
  em: EntityManager,
  event: DeliveryFeedback,
  deps: { metrics?: Metrics; now: Date },
): Promise<ProviderEventResult | undefined> {
  const outcome = await em.transactional(async (tx) => {
    const email = await lockEmailByMessageId(tx as EntityManager, {
      ...(event.messageId ? { messageId: bareMessageId(event.messageId) } : {}),
      ...(event.providerMessageId ? { providerMessageId: event.providerMessageId.trim() } : {}),
    });
    if (!email) return undefined;
    // The recipient it names, as a report by mail's (a text that is no address names none of them).
    const named = event.recipient === undefined ? null : (bareAddress(event.recipient) ?? event.recipient);
    const about = aboutRecipient(named, { to: email.address, copies: bareAddresses(email.copies) });
    if (!about) return undefined;
    const item: FeedbackItem = { emailId: email.id, type: event.type, bounceType: event.bounceType, diagnostic: event.diagnostic, ...about };
    const [result] = await recordFeedback(tx as EntityManager, new Map([[email.id, email]]), [item], deps.now);
    return { item, result: result! };
  });
  if (!outcome) return undefined;
  countFeedback(deps.metrics, [outcome.item], [outcome.result]);
  return { emailId: outcome.result.emailId, changed: outcome.result.changed };
}

/** The generic webhook `POST /webhooks/provider` (docs/outcomes.md "Provider webhook"): an event for a Message-ID no email has is 404. */
export async function applyProviderEvent(
  em: EntityManager,
  event: ProviderEvent,
  deps: { metrics?: Metrics; now: Date },
): Promise<ProviderEventResult> {
  const result = await applyDeliveryFeedback(em, event, deps);
  if (!result) throw new NotFoundError(`No email has the Message-ID ${event.messageId}`);
  return result;
}

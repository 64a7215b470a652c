import type { SubscriberStatus } from '../db/entities/index.js';

/**
 * Subscriber status transitions of a create (upsert) or a patch, as one table
 * (docs/audience.md "Status transitions"). Rows the spec leaves open are decided here and in
 * docs/audience.md.
 */
export interface TransitionInput {
  /** null: the address is new to the organization. */
  current: SubscriberStatus | null;
  operation: 'create' | 'patch';
  /** As given; `create` defaults it to true, `patch` to false. */
  resubscribe?: boolean;
  skipDoubleOptIn?: boolean;
  /** The organization's double opt-in setting. */
  doubleOptIn: boolean;
}

function optIn(input: TransitionInput): SubscriberStatus {
  return input.doubleOptIn && input.skipDoubleOptIn !== true ? 'PENDING_CONFIRMATION' : 'SUBSCRIBED';
}

type Rule = (input: TransitionInput) => SubscriberStatus;

const stay: Rule = (input) => input.current as SubscriberStatus;

const TRANSITIONS: Record<SubscriberStatus | 'NEW', Rule> = {
  // Spec: double opt-in off or skipped -> SUBSCRIBED; otherwise PENDING_CONFIRMATION.
  NEW: optIn,
  // Spec: resubscribe (default true on create, false on patch) re-subscribes directly.
  UNSUBSCRIBED: (input) => (resubscribes(input) ? 'SUBSCRIBED' : 'UNSUBSCRIBED'),
  // Spec: skipDoubleOptIn promotes (on patch; and on an upsert, which is the same intent).
  PENDING_CONFIRMATION: (input) => (input.skipDoubleOptIn === true ? 'SUBSCRIBED' : 'PENDING_CONFIRMATION'),
  // Decision: a contact known only from transactional mail opts in like a new one when it
  // is created as a subscriber, or patched with resubscribe: true.
  TRANSACTIONAL: (input) => (input.operation === 'create' || input.resubscribe === true ? optIn(input) : 'TRANSACTIONAL'),
  SUBSCRIBED: stay,
  // Decision: suppressions set by delivery events or an operator are never lifted by the API.
  BOUNCED: stay,
  COMPLAINED: stay,
  BANNED: stay,
};

function resubscribes(input: TransitionInput): boolean {
  return input.resubscribe ?? input.operation === 'create';
}

export function nextStatus(input: TransitionInput): SubscriberStatus {
  return TRANSITIONS[input.current ?? 'NEW'](input);
}

/** The unsubscribe operation: these states become UNSUBSCRIBED; suppressions stay as they are. */
export const UNSUBSCRIBABLE: readonly SubscriberStatus[] = ['SUBSCRIBED', 'PENDING_CONFIRMATION', 'TRANSACTIONAL', 'UNSUBSCRIBED'];

import type { EntityManager } from '@mikro-orm/postgresql';
import { upsertHistory } from './queries.js';
import { parseAddress } from './syntax.js';

/**
 * Trusted global history (docs/verification.md "History"): the service's own delivery outcomes per
 * normalized address, across every organization, in `verification_history`. Delivery outcomes
 * (webhooks, bounces, tracking) call these functions; the checks read the table. Each call is one
 * idempotent upsert: recording an outcome twice keeps the latest time.
 */
export type HistoryOutcome = 'hard_bounced_at' | 'complained_at' | 'mailbox_full_at' | 'mailbox_not_found_at' | 'proven_at';

/** How long a full mailbox counts: it is temporary by nature (retry after this). */
export const MAILBOX_FULL_WINDOW_MS = 72 * 3600 * 1000;
/** A domain with this many distinct addresses that bounced as unknown is `suspicious_domain`. */
export const RECURRING_BOUNCES = 3;
/** The history row that stands for a whole domain (catch-all evidence). */
export const domainRowKey = (domain: string) => `*@${domain}`;

/** The row key of an address in `verification_history`: normalized address and domain. */
export function historyKey(email: string): { email: string; domain: string } {
  const parsed = parseAddress(email);
  if (parsed.ok) return { email: parsed.email, domain: parsed.domain };
  const raw = email.trim().toLowerCase();
  return { email: raw, domain: raw.slice(raw.lastIndexOf('@') + 1) };
}

async function record(em: EntityManager, email: string, column: HistoryOutcome | 'suppressed', at: Date, value?: boolean): Promise<void> {
  const { email: key, domain } = historyKey(email);
  // Through the EntityManager, so that inside a transaction (the delivery-feedback recorder)
  // the write joins it: the connection's own execute takes a second pooled connection, which
  // under concurrent events left every pooled connection waiting for another.
  await upsertHistory(em, { email: key, domain, column, at, value });
}

/** A permanent failure (5.x.x) for this address. */
export const recordHardBounce = (em: EntityManager, email: string, at = new Date()) => record(em, email, 'hard_bounced_at', at);
/** A spam complaint (feedback loop) about a message to this address. */
export const recordComplaint = (em: EntityManager, email: string, at = new Date()) => record(em, email, 'complained_at', at);
/** Mailbox over quota (4.2.2 / 5.2.2): temporary, counts for MAILBOX_FULL_WINDOW_MS. */
export const recordMailboxFull = (em: EntityManager, email: string, at = new Date()) => record(em, email, 'mailbox_full_at', at);
/** The receiving server said the mailbox does not exist (5.1.1). */
export const recordMailboxNotFound = (em: EntityManager, email: string, at = new Date()) => record(em, email, 'mailbox_not_found_at', at);
/** An open or a click of a delivered email: the mailbox exists and is read. */
export const recordProven = (em: EntityManager, email: string, at = new Date()) => record(em, email, 'proven_at', at);
/** Put the address on (or take it off) the global suppression list. */
export const recordSuppression = (em: EntityManager, email: string, suppressed = true, at = new Date()) =>
  record(em, email, 'suppressed', at, suppressed);
/**
 * The domain accepted mail for a mailbox that cannot exist (a delivered message to a
 * generated address): every address on it is `catch_all`.
 */
export const recordCatchAllDomain = (em: EntityManager, domain: string, at = new Date()) =>
  record(em, domainRowKey(domain.trim().toLowerCase()), 'proven_at', at);

export interface HistoryRow {
  hardBouncedAt: Date | null;
  complainedAt: Date | null;
  suppressed: boolean;
  mailboxFullAt: Date | null;
  mailboxNotFoundAt: Date | null;
  provenAt: Date | null;
  /** The domain has been recorded as accepting mail for any mailbox. */
  catchAll: boolean;
  /** Distinct other addresses of the domain that bounced or were not found (capped). */
  domainBadAddresses: number;
}

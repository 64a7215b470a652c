import type { EntityManager } from '@mikro-orm/postgresql';
import type { LinkSigner } from '../crypto.js';
import { laidOut } from '../emails/render.js';
import { escapeHtml } from '../html.js';
import { lockConfirmationTarget, markConfirmed, selectConfirmationTarget } from './queries.js';
import { toRecord } from './rows.js';
import { tagsOf } from './service.js';
import { recordContactEvent } from '../webhooks/queries.js';

/**
 * Double opt-in (docs/audience.md "Double opt-in"): a PENDING_CONFIRMATION subscriber gets an
 * email whose link `GET {PUBLIC_URL}/confirm/{token}` makes it SUBSCRIBED. The token signs
 * the subscriber id and its address, so a link never confirms an address changed since.
 */
export const CONFIRM_PURPOSE = 'confirm';

export function confirmationToken(signer: LinkSigner, subscriber: { id: string; email: string }): string {
  return signer.sign(CONFIRM_PURPOSE, `${subscriber.id} ${subscriber.email}`);
}

/**
 * The queue job that sends a subscriber's confirmation email, named by the confirmation record
 * (the subscriber and the time it became pending): the write that made it pending and the
 * reconciler (workers/subscribers.ts) never queue two for one record, and a subscriber pending
 * again gets a job (and an email) of its own even while the earlier job is still kept.
 */
export function confirmationJob(subscriberId: string, owedSince: Date) {
  return {
    name: 'send-confirmation' as const,
    data: { subscriberId, owedSince: owedSince.getTime() },
    jobId: confirmationJobId(subscriberId, owedSince.getTime()),
  };
}

/** The job id of a confirmation record, and the idempotency key of its email. */
export function confirmationJobId(subscriberId: string, owedSince: number): string {
  return `confirm-${subscriberId}-${owedSince}`;
}

export function confirmationUrl(publicUrl: string, token: string): string {
  return `${publicUrl.replace(/\/+$/, '')}/confirm/${token}`;
}

export interface ConfirmationEmailInput {
  organization: { name: string };
  subscriber: { email: string; name: string | null };
  confirmUrl: string;
}

/**
 * The confirmation message, as HTML (the send pipeline derives its text part): the name, the
 * organization and the address are the subscriber's own words, escaped as text, so none of
 * them becomes a link or markup (as Markdown would: its autolinks turn a URL in a name into a
 * live link). Pure, no I/O.
 */
export function buildConfirmationEmail(input: ConfirmationEmailInput): { subject: string; html: string } {
  const org = input.organization.name.replace(/[\r\n]+/g, ' ').trim();
  const url = escapeHtml(input.confirmUrl);
  const greeting = input.subscriber.name ? `Hello ${escapeHtml(input.subscriber.name)},` : 'Hello,';
  const subject = `Confirm your subscription to ${org}`;
  const body = [
    `<p>${greeting}</p>`,
    `<p>Please confirm that you want to receive emails from ${escapeHtml(org)} at ${escapeHtml(input.subscriber.email)}.</p>`,
    `<p><a href="${url}">Confirm my subscription</a></p>`,
    `<p>Or open this link: ${url}</p>`,
    '<p>If you did not ask for this, ignore this email: you will not be subscribed.</p>',
  ].join('\n');
  // The layout and inlined styles of every rendered email (as its Markdown got them).
  return { subject, html: laidOut(body, subject, null) };
}

export type ConfirmOutcome = 'confirmed' | 'already_confirmed' | 'not_pending';

export interface ConfirmEvidence {
  ip: string | null;
  userAgent: string | null;
  now: Date;
}

/** The subscriber a confirmation token names, read only (the GET page); null when forged or gone. */
export async function findConfirmation(
  em: EntityManager,
  signer: LinkSigner,
  token: string,
): Promise<{ email: string; status: string; organizationName: string } | null> {
  const value = signer.verify(CONFIRM_PURPOSE, token);
  const [id, email] = value?.split(' ') ?? [];
  if (!id || !email) return null;
  const row = await selectConfirmationTarget(em, id, email);
  return row ? { email: row.email, status: row.status, organizationName: row.organization_name } : null;
}

/**
 * Confirms the subscriber of a token and stores the evidence. Null when the token is
 * forged, altered, or names no subscriber with that address any more.
 */
export async function confirmSubscription(
  em: EntityManager,
  signer: LinkSigner,
  token: string,
  evidence: ConfirmEvidence,
): Promise<{ outcome: ConfirmOutcome; organizationName: string } | null> {
  const value = signer.verify(CONFIRM_PURPOSE, token);
  const [id, email] = value?.split(' ') ?? [];
  if (!id || !email) return null;
  return em.transactional(async (tx) => {
    const row = await lockConfirmationTarget(tx, id, email);
    if (!row) return null;
    const organizationName = row.organization_name;
    if (row.status === 'SUBSCRIBED') return { outcome: 'already_confirmed' as const, organizationName };
    if (row.status !== 'PENDING_CONFIRMATION') return { outcome: 'not_pending' as const, organizationName };
    const confirmed = await markConfirmed(tx, row.id, { now: evidence.now, ip: evidence.ip, userAgent: evidence.userAgent?.slice(0, 1000) ?? null });
    await recordContactEvent(tx, 'contact.updated', toRecord(confirmed!, (await tagsOf(tx, [row.id])).get(row.id) ?? []));
    return { outcome: 'confirmed' as const, organizationName };
  });
}

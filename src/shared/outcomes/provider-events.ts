import type { EntityManager } from '@mikro-orm/postgresql';
import { z } from 'zod';
import { NotFoundError } from '../errors.js';
import type { Metrics } from '../metrics.js';
import { recordComplaint, recordHardBounce, recordMailboxFull, recordMailboxNotFound, recordProven } from '../verification/index.js';
import { recordEmailEvents } from '../webhooks/queries.js';

/** Contract 11: the body of `POST /webhooks/provider`. */
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
const RANK_SQL = (column: string) => `coalesce(case ${column} when 'delivered' then 1 when 'bounced' then 2 when 'complained' then 3 end, 0)`;

interface EmailRow {
  id: string;
  organization_id: string;
  address: string;
}

/** What happened to a message, as any source of delivery feedback reports it. */
export type ProviderOutcome = 'delivered' | 'bounced' | 'complained' | 'delivery_delayed';

/**
 * One delivery event, whatever its source: contract 11's own webhook, a provider's webhook
 * (src/shared/providers) or a bounce report by mail. The email is found by the Message-ID
 * mailroom set or, where a relay replaced it, by the id the relay gave at hand-over.
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
}

export interface ProviderEventResult {
  emailId: string;
  /** False when the event was a replay or lower in precedence than the current status. */
  changed: boolean;
}

/** Message-IDs are compared without angle brackets and surrounding space. */
export function bareMessageId(value: string): string {
  return value.trim().replace(/^<(.*)>$/, '$1').trim();
}

async function findEmail(tx: EntityManager, event: DeliveryFeedback): Promise<EmailRow | undefined> {
  const select = `select e.id, e.organization_id, email_bare_address(e.to_address) as address from emails e`;
  if (event.messageId) {
    const [email] = await tx.execute<EmailRow[]>(`${select} where e.message_id = ? limit 1`, [bareMessageId(event.messageId)], 'all');
    if (email) return email;
  }
  if (event.providerMessageId) {
    const [email] = await tx.execute<EmailRow[]>(`${select} where e.provider_message_id = ? limit 1`, [event.providerMessageId.trim()], 'all');
    if (email) return email;
  }
  return undefined;
}

/**
 * Applies one delivery event in one transaction; every write is idempotent (a replay changes
 * nothing). A hard bounce or a complaint suppresses the address in the email's organization,
 * marks that organization's subscriber BOUNCED / COMPLAINED and feeds the global verification
 * history (contract 11, 13). A delay is recorded as an event and moves no status. Undefined
 * when no email matches (the caller decides whether that is an error).
 */
export async function applyDeliveryFeedback(
  em: EntityManager,
  event: DeliveryFeedback,
  deps: { metrics?: Metrics; now: Date },
): Promise<ProviderEventResult | undefined> {
  const result = await em.transactional(async (tx) => {
    const email = await findEmail(tx as EntityManager, event);
    if (!email) return undefined;
    const bounceType = event.type === 'bounced' ? (event.bounceType ?? 'hard') : undefined;
    const details = { ...(bounceType ? { bounceType } : {}), ...(event.diagnostic ? { diagnostic: event.diagnostic.slice(0, 2_000) } : {}) };

    const inserted = await tx.execute<{ email_id: string }[]>(
      `insert into email_events (email_id, organization_id, type, occurred_at, details) values (?, ?, ?, ?, ?::jsonb)
       on conflict (email_id, type) where type in ('delivered', 'bounced', 'complained', 'delivery_delayed') do nothing returning email_id`,
      [email.id, email.organization_id, event.type, deps.now, JSON.stringify(details)],
      'all',
    );
    const hook = { emailId: email.id, extra: bounceType ? { bounce: { type: bounceType, diagnostic: event.diagnostic ?? null } } : undefined };
    if (inserted.length > 0) await recordEmailEvents(tx, `email.${event.type}`, [hook]);
    if (event.type === 'delivery_delayed') return { emailId: email.id, changed: false, fresh: inserted.length > 0, bounceType };
    const updated = await tx.execute<{ id: string }[]>(
      `update emails set delivery_status = ?, updated_at = now() where id = ? and ${RANK_SQL('delivery_status')} < ${RANK_SQL('?::text')} returning id`,
      [event.type, email.id, event.type],
      'all',
    );

    const suppress = event.type === 'complained' || bounceType === 'hard';
    if (suppress) {
      const reason = event.type === 'complained' ? 'complaint' : 'hard_bounce';
      await tx.execute(
        `insert into suppressions (organization_id, address, reason, email_id, created_at) values (?, ?, ?, ?, ?)
         on conflict (organization_id, address) do nothing`,
        [email.organization_id, email.address, reason, email.id, deps.now],
        'run',
      );
      // A complaint is the stronger statement; BANNED (an operator's decision) stays.
      const status = event.type === 'complained' ? 'COMPLAINED' : 'BOUNCED';
      const keep = event.type === 'complained' ? `('COMPLAINED', 'BANNED')` : `('BOUNCED', 'COMPLAINED', 'BANNED')`;
      await tx.execute(
        `update subscribers set status = ?, updated_at = ? where organization_id = ? and email = ? and status not in ${keep}`,
        [status, deps.now, email.organization_id, email.address],
        'run',
      );
      if (event.type === 'complained') await recordComplaint(tx as EntityManager, email.address, deps.now);
      else await recordHardBounce(tx as EntityManager, email.address, deps.now);
    }
    // The provider's word that the mailbox took the message: trusted evidence for the global
    // history (opens and clicks are not: docs/security.md).
    if (event.type === 'delivered') await recordProven(tx as EntityManager, email.address, deps.now);
    if (event.type === 'bounced' && event.diagnostic) {
      // The remote answer's enhanced status code says more than hard/soft (RFC 3463).
      if (/\b5\.1\.1\b/.test(event.diagnostic)) await recordMailboxNotFound(tx as EntityManager, email.address, deps.now);
      else if (/\b[45]\.2\.2\b/.test(event.diagnostic)) await recordMailboxFull(tx as EntityManager, email.address, deps.now);
    }
    return { emailId: email.id, changed: updated.length > 0, fresh: inserted.length > 0, bounceType };
  });
  if (!result) return undefined;

  if (result.fresh && deps.metrics) {
    if (event.type === 'delivered') deps.metrics.emailsDelivered.inc();
    else if (event.type === 'bounced') deps.metrics.emailsBounced.inc({ type: result.bounceType ?? 'hard' });
    else if (event.type === 'complained') deps.metrics.emailsComplained.inc();
  }
  return { emailId: result.emailId, changed: result.changed };
}

/** Contract 11's webhook: an event for a Message-ID no email has is 404. */
export async function applyProviderEvent(
  em: EntityManager,
  event: ProviderEvent,
  deps: { metrics?: Metrics; now: Date },
): Promise<ProviderEventResult> {
  const result = await applyDeliveryFeedback(em, event, deps);
  if (!result) throw new NotFoundError(`No email has the Message-ID ${event.messageId}`);
  return result;
}

import type { EntityManager } from '@mikro-orm/postgresql';
import type { ContentKind } from '../db/entities/email.js';
import type { Logger } from '../logger.js';
import { mailboxDomain } from './addresses.js';
import { renderEmail } from './render.js';
import { classifySendError, type MailTransport } from './transport.js';

/** The hand-over failed in a way that may succeed later: the job is retried. */
export class RetryLaterError extends Error {
  constructor(
    message: string,
    /** A provider throttle answer: retried later without ever failing the email. */
    readonly throttle: boolean,
  ) {
    super(message);
    this.name = 'RetryLaterError';
  }
}

export type DeliverOutcome =
  | { outcome: 'sent' | 'delivered'; messageId: string }
  | { outcome: 'failed'; reason: string }
  | { outcome: 'skipped'; status: string };

interface ClaimedRow {
  id: string;
  from_address: string;
  to_address: string;
  cc: string[] | null;
  bcc: string[] | null;
  reply_to: string[] | null;
  subject: string;
  content_kind: ContentKind;
  content: string;
  preview: string | null;
  text: string | null;
  headers: Record<string, string>;
}

/**
 * Hands one email to the provider at most once (contract 15). The row is claimed with a
 * conditional update (queued -> sending) before anything is sent, so a retry, a stalled job
 * or a second worker that finds it already claimed, sent or failed sends nothing.
 *
 * - accepted: status sent (the file transport also marks it delivered), Message-ID, the
 *   rendered HTML and text stored;
 * - 5xx or a message that cannot be built: status failed with the reason;
 * - 4xx or a connection error: the claim is released (queued) and RetryLaterError thrown,
 *   unless `finalAttempt`, then failed.
 */
export async function deliverEmail(
  em: EntityManager,
  transport: MailTransport,
  emailId: string,
  options: { finalAttempt: boolean; log?: Logger },
): Promise<DeliverOutcome> {
  const [row] = await em.execute<ClaimedRow[]>(
    `update emails set status = 'sending', claimed_at = now(), attempts = attempts + 1, updated_at = now()
     where id = ? and status = 'queued'
     returning id, from_address, to_address, cc, bcc, reply_to, subject, content_kind, content, preview, text, headers`,
    [emailId],
    'all',
  );
  if (!row) {
    const [current] = await em.execute<{ status: string }[]>('select status from emails where id = ?', [emailId], 'all');
    return { outcome: 'skipped', status: current?.status ?? 'missing' };
  }

  let rendered: { html: string; text: string };
  try {
    rendered = renderEmail({ contentKind: row.content_kind, content: row.content, subject: row.subject, preview: row.preview, text: row.text });
  } catch (error) {
    const reason = `rendering failed: ${(error as Error).message}`.slice(0, 1000);
    await finish(em, emailId, `status = 'failed', failure_reason = ?`, [reason]);
    return { outcome: 'failed', reason };
  }

  const fromDomain = mailboxDomain(row.from_address);
  const messageId = `${row.id}@${fromDomain}`;
  let delivered: boolean;
  try {
    ({ delivered } = await transport.send({
      id: row.id,
      from: row.from_address,
      to: row.to_address,
      cc: row.cc,
      bcc: row.bcc,
      replyTo: row.reply_to,
      subject: row.subject,
      html: rendered.html,
      text: rendered.text,
      messageId,
      fromDomain,
      headers: row.headers,
    }));
  } catch (error) {
    const { kind, reason } = classifySendError(error);
    if (kind === 'permanent' || (kind === 'transient' && options.finalAttempt)) {
      await finish(em, emailId, `status = 'failed', failure_reason = ?`, [reason]);
      return { outcome: 'failed', reason };
    }
    // Not handed over: release the claim so the retry can take it again.
    await finish(em, emailId, `status = 'queued', failure_reason = ?`, [reason]);
    throw new RetryLaterError(reason, kind === 'throttle');
  }

  await finishAfterSend(
    em,
    emailId,
    `status = 'sent', delivery_status = ${delivered ? `'delivered'` : 'delivery_status'}, message_id = ?, html = ?, text = ?, sent_at = now(), failure_reason = null`,
    [messageId, rendered.html, rendered.text],
    options.log,
  );
  return { outcome: delivered ? 'delivered' : 'sent', messageId };
}

async function finish(em: EntityManager, id: string, set: string, params: unknown[]): Promise<void> {
  await em.execute(`update emails set ${set}, updated_at = now() where id = ? and status = 'sending'`, [...params, id], 'run');
}

// After the provider accepted, the row must say so, or a later run would count it as an
// interrupted hand-over: the write is retried for about half a minute before giving up.
const RECORD_RETRIES = [200, 500, 1_000, 2_000, 5_000, 10_000, 15_000];

async function finishAfterSend(em: EntityManager, id: string, set: string, params: unknown[], log?: Logger): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await finish(em, id, set, params);
      return;
    } catch (error) {
      const wait = RECORD_RETRIES[attempt];
      if (wait === undefined) {
        log?.error({ err: error, emailId: id }, 'the provider accepted the email but its status could not be recorded');
        throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }
}

/**
 * Reconciler, part 1: rows claimed (`sending`) longer ago than `leaseMs` were interrupted
 * mid hand-over (the worker died); they are failed rather than risk a duplicate.
 */
export async function failInterruptedEmails(em: EntityManager, leaseMs: number): Promise<number> {
  const rows = await em.execute<{ id: string }[]>(
    `update emails set status = 'failed', updated_at = now(),
       failure_reason = 'interrupted while being handed to the provider; not retried so that it is never sent twice'
     where status = 'sending' and claimed_at < now() - (? * interval '1 millisecond')
     returning id`,
    [leaseMs],
    'all',
  );
  return rows.length;
}

/** Reconciler, part 2: one keyset page of queued emails older than `graceMs`. */
export async function queuedEmailsPage(
  em: EntityManager,
  options: { graceMs: number; afterId?: string; limit: number },
): Promise<{ id: string; source: 'api' | 'campaign' | 'test' }[]> {
  return em.execute(
    `select id, source from emails
     where status in ('queued', 'sending') and status = 'queued' and id > ? and created_at < now() - (? * interval '1 millisecond')
     order by id limit ?`,
    [options.afterId ?? '', options.graceMs, options.limit],
    'all',
  );
}

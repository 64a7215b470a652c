import type { EntityManager } from '@mikro-orm/postgresql';
import { mailboxDomain } from '../emails/addresses.js';
import type { Logger } from '../logger.js';
import type { Metrics } from '../metrics.js';
import { applyProviderEvent } from '../outcomes/provider-events.js';
import { readReport } from './report.js';
import { returnPathHost } from './return-path.js';
import { claimReport, emailById, emailByMessageId, finishReport, pendingReport, type ReportEmail } from './store.js';
import { verdictOf, type Verdict } from './verdict.js';

export interface ReportOutcome {
  status: 'applied' | 'ignored';
  emailId: string | null;
  verdict: Verdict;
  /** The customer webhook event this report stands for (contract 17), when it is one. */
  event?: 'email.bounced' | 'email.complained' | 'email.delivery_delayed';
  /** False when the outcome recorder found nothing new (a replay or a lower status). */
  changed?: boolean;
}

export interface ProcessDeps {
  /** BOUNCE_DOMAIN: the return-path host of mail from domains an organization does not own. */
  bounceDomain: string;
  metrics?: Metrics;
  now: Date;
  log?: Logger;
}

/** The customer webhook event type of a verdict (contract 17), if it is one. */
export function webhookEventOf(verdict: Verdict): ReportOutcome['event'] {
  if (verdict.type === 'bounced') return 'email.bounced';
  if (verdict.type === 'complained') return 'email.complained';
  if (verdict.type === 'delayed') return 'email.delivery_delayed';
  return undefined;
}

/**
 * Reads one stored report and applies it (contract 18a). The email is the one its return-path
 * token names; the returned message's Message-ID, when the report carries it, must be that
 * email's or another email of the same organization (a feedback loop registered with one
 * return path reports others), never another organization's. The effects are those of the
 * provider webhook (contract 11), through the same function (`applyProviderEvent`), in the
 * transaction that marks the report read: a report has one effect however often its job runs,
 * and the same report received twice has one effect because every write of that function is
 * idempotent. Returns null when the report is unknown or already read.
 */
export async function processReport(em: EntityManager, reportId: string, deps: ProcessDeps): Promise<ReportOutcome | null> {
  const report = await pendingReport(em, reportId);
  if (!report) return null;
  const read = await readReport(report.raw, report.mail_from);
  const { email, reason } = await matchEmail(em, report.email_id, report.rcpt_to, read.originalMessageId, deps.bounceDomain);
  const verdict: Verdict = email ? verdictOf(read, { to: email.address, hasCopies: email.has_copies }) : { type: 'ignored', reason: reason! };
  const event = webhookEventOf(verdict);

  return em.transactional(async (tx) => {
    const outcome: ReportOutcome = { status: verdict.type === 'ignored' ? 'ignored' : 'applied', emailId: email?.id ?? null, verdict, ...(event ? { event } : {}) };
    if (!(await claimReport(tx as EntityManager, reportId))) return null;
    if (email && (verdict.type === 'bounced' || verdict.type === 'complained')) {
      const result = await applyProviderEvent(
        tx as EntityManager,
        { type: verdict.type, messageId: email.message_id!, bounceType: verdict.type === 'bounced' ? verdict.bounceType : undefined, diagnostic: verdict.diagnostic },
        { metrics: deps.metrics, now: deps.now },
      );
      outcome.changed = result.changed;
    }
    await finishReport(tx as EntityManager, reportId, outcome.status, outcome, deps.now);
    // Customer webhooks (contract 17): `event` is written to the webhook outbox here, in this
    // transaction, once that outbox exists; until then it is recorded with the report.
    deps.log?.info({ reportId, emailId: outcome.emailId, verdict: verdict.type, ...(verdict.type === 'ignored' ? { reason: verdict.reason } : {}) }, 'inbound report read');
    return outcome;
  });
}

async function matchEmail(
  em: EntityManager,
  tokenEmailId: string,
  rcptTo: string,
  originalMessageId: string | null,
  bounceDomain: string,
): Promise<{ email?: ReportEmail; reason?: string }> {
  const byToken = await emailById(em, tokenEmailId);
  if (!byToken || !byToken.message_id) return { reason: 'the return path names no email that was sent' };
  const host = rcptTo.slice(rcptTo.lastIndexOf('@') + 1).toLowerCase();
  const fromDomain = mailboxDomain(byToken.from_address);
  if (host !== returnPathHost(fromDomain, true, bounceDomain) && host !== bounceDomain.toLowerCase()) {
    return { reason: `the return path's host ${host.slice(0, 100)} is not the email's` };
  }
  if (!originalMessageId || originalMessageId === byToken.message_id) return { email: byToken };
  const byMessageId = await emailByMessageId(em, originalMessageId);
  if (byMessageId?.message_id && byMessageId.organization_id === byToken.organization_id) return { email: byMessageId };
  return { reason: 'the returned message is not an email of the organization the return path names' };
}

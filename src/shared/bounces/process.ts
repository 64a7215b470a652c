import type { EntityManager } from '@mikro-orm/postgresql';
import { mailboxDomain } from '../emails/addresses.js';
import type { Metrics } from '../metrics.js';
import { applyDeliveryFeedback } from '../outcomes/provider-events.js';
import { readReport } from './report.js';
import { returnPathHost } from './return-path.js';
import { claimReports, emailByMessageId, emailsById, finishReports, pendingReports, type ReportEmail } from './store.js';
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
}

/** The customer webhook event type of a verdict (contract 17), if it is one. */
export function webhookEventOf(verdict: Verdict): ReportOutcome['event'] {
  if (verdict.type === 'bounced') return 'email.bounced';
  if (verdict.type === 'complained') return 'email.complained';
  if (verdict.type === 'delayed') return 'email.delivery_delayed';
  return undefined;
}

/**
 * Reads stored reports and applies them (contract 18a). The email is the one a report's
 * return-path token names; the returned message's Message-ID, when the report carries it,
 * must be that email's or another email of the same organization (a feedback loop
 * registered with one return path reports others), never another organization's. The
 * effects are those of the provider webhook (contract 11), through the same function
 * (`applyDeliveryFeedback`, as the provider webhooks), in the transaction that marks the reports read (their rows locked
 * first): a report has one effect however often its job runs, and the same report received
 * twice has one effect because every write of that function is idempotent. The reports of
 * one SMTP batch are read together (one query for the reports, one for their emails, one
 * transaction). Returns the outcome of each report read now; unknown and already read
 * reports are left out.
 */
export async function processReports(em: EntityManager, reportIds: string[], deps: ProcessDeps): Promise<Map<string, ReportOutcome>> {
  const reports = await pendingReports(em, reportIds);
  const done = new Map<string, ReportOutcome>();
  if (reports.length === 0) return done;
  const emails = await emailsById(em, [...new Set(reports.map((r) => r.email_id))]);
  const planned: { id: string; email?: ReportEmail; outcome: ReportOutcome }[] = [];
  for (const report of reports) {
    const read = await readReport(report.raw, report.mail_from);
    const { email, reason } = await matchEmail(em, emails.get(report.email_id), report.rcpt_to, read.originalMessageId, deps.bounceDomain);
    const verdict: Verdict = email ? verdictOf(read, { to: email.address, hasCopies: email.has_copies }) : { type: 'ignored', reason: reason! };
    const event = webhookEventOf(verdict);
    planned.push({ id: report.id, email, outcome: { status: verdict.type === 'ignored' ? 'ignored' : 'applied', emailId: email?.id ?? null, verdict, ...(event ? { event } : {}) } });
  }

  return em.transactional(async (tx) => {
    const claimed = await claimReports(tx as EntityManager, planned.map((p) => p.id));
    for (const { id, email, outcome } of planned) {
      if (!claimed.has(id)) continue;
      const verdict = outcome.verdict;
      if (email && verdict.type !== 'ignored') {
        const result = await applyDeliveryFeedback(
          tx as EntityManager,
          {
            type: verdict.type === 'delayed' ? 'delivery_delayed' : verdict.type,
            messageId: email.message_id!,
            bounceType: verdict.type === 'bounced' ? verdict.bounceType : undefined,
            diagnostic: verdict.diagnostic,
          },
          { metrics: deps.metrics, now: deps.now },
        );
        outcome.changed = result?.changed ?? false;
      }
      // Customer webhooks (contract 17): `outcome.event` is written to the webhook outbox
      // here, in this transaction, once that outbox exists; until then it is recorded with
      // the report.
      done.set(id, outcome);
    }
    await finishReports(tx as EntityManager, [...done].map(([id, outcome]) => ({ id, outcome })), deps.now);
    return done;
  });
}

async function matchEmail(
  em: EntityManager,
  byToken: ReportEmail | undefined,
  rcptTo: string,
  originalMessageId: string | null,
  bounceDomain: string,
): Promise<{ email?: ReportEmail; reason?: string }> {
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

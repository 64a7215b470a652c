import type { EntityManager } from '@mikro-orm/postgresql';
import { mailboxDomain } from '../emails/addresses.js';
import type { Metrics } from '../metrics.js';
import { applyFeedbackBatch, countFeedback, type FeedbackItem } from '../outcomes/provider-events.js';
import { bareAddresses } from './fields.js';
import { readReport, type ReadReport } from './report.js';
import { returnPathHost } from './return-path.js';
import { claimReports, emailsById, emailsByMessageId, finishReports, pendingReports, type ReportEmail } from './queries.js';
import { verdictOf, type Verdict } from './verdict.js';

/** A report's outcome as the metric counts it (docs/operations.md). */
export type ReportMetricOutcome = 'applied' | 'duplicate' | 'unmatched' | 'refused';

export interface ReportOutcome {
  status: 'applied' | 'ignored';
  /** Ignored because no email of the return path's organization matches (not for its content). */
  unmatched?: boolean;
  emailId: string | null;
  verdict: Verdict;
  /** The customer webhook event this report stands for (docs/webhooks.md), when it is one. */
  event?: 'email.bounced' | 'email.complained' | 'email.delivery_delayed';
  /** False when the outcome recorder found nothing new (a replay or a lower status). */
  changed?: boolean;
  /** The report's event was recorded now (not a replay of one already recorded). */
  fresh?: boolean;
}

export interface ProcessDeps {
  /** BOUNCE_DOMAIN: the return-path host of mail from domains an organization does not own. */
  bounceDomain: string;
  metrics?: Metrics;
  now: Date;
}

/** The customer webhook event type of a verdict (docs/webhooks.md "Event types"), if it is one. */
function webhookEventOf(verdict: Verdict): ReportOutcome['event'] {
  if (verdict.type === 'bounced') return 'email.bounced';
  if (verdict.type === 'complained') return 'email.complained';
  if (verdict.type === 'delayed') return 'email.delivery_delayed';
  return undefined;
}

/** The metric outcome of a report read. */
function metricOutcome(outcome: ReportOutcome): ReportMetricOutcome {
  if (outcome.status === 'ignored') return outcome.unmatched ? 'unmatched' : 'refused';
  return outcome.changed || outcome.fresh ? 'applied' : 'duplicate';
}

/**
 * Reads stored reports and applies them (docs/outcomes.md "Bounces and complaints by mail"). The
 * email is the one a report's return-path token names; the returned message's Message-ID, when the
 * report carries it, must be that email's or another email of the same organization (a feedback
 * loop registered with one return path reports others), never another organization's. The effects
 * are those of the provider webhooks (docs/outcomes.md "Provider webhook"), through the same
 * recorder (`applyFeedbackBatch`, one statement a table for the whole batch), in the transaction
 * that marks the reports read (their rows locked first): a report has one effect however often its
 * job runs, and the same report received twice has one effect because every write of the recorder
 * is idempotent. The reports of one job are read together (one query for the reports, one for their
 * emails, one transaction). Returns the outcome of each report read now; unknown and already read
 * reports are left out.
 */
export async function processReports(em: EntityManager, reportIds: string[], deps: ProcessDeps): Promise<Map<string, ReportOutcome>> {
  const reports = await pendingReports(em, reportIds);
  const done = new Map<string, ReportOutcome>();
  if (reports.length === 0) return done;
  const emails = await emailsById(em, [...new Set(reports.map((r) => r.email_id))]);
  const reads: ReadReport[] = [];
  for (const report of reports) reads.push(await readReport(report.raw, report.mail_from));
  // The returned messages that are not the token's email, in one query (feedback loops).
  const otherIds = reads.map((read) => read.originalMessageId).filter((id, i): id is string => id !== null && id !== emails.get(reports[i]!.email_id)?.message_id);
  const byMessageId = await emailsByMessageId(em, [...new Set(otherIds)]);
  const planned: { id: string; email?: ReportEmail; outcome: ReportOutcome }[] = [];
  for (const [i, report] of reports.entries()) {
    const read = reads[i]!;
    const { email, reason } = matchEmail(emails.get(report.email_id), report.rcpt_to, read.originalMessageId, byMessageId, deps.bounceDomain);
    const copies = email ? bareAddresses(email.copies) : [];
    const verdict: Verdict = email ? verdictOf(read, { to: email.address, copies }) : { type: 'ignored', reason: reason! };
    const event = webhookEventOf(verdict);
    planned.push({
      id: report.id,
      email,
      outcome: { status: verdict.type === 'ignored' ? 'ignored' : 'applied', ...(email ? {} : { unmatched: true }), emailId: email?.id ?? null, verdict, ...(event ? { event } : {}) },
    });
  }

  const { outcomes, items, results } = await em.transactional(async (tx) => {
    const claimed = await claimReports(tx as EntityManager, planned.map((p) => p.id));
    const read = planned.filter((p) => claimed.has(p.id));
    const applied = read.filter((p) => p.email && p.outcome.verdict.type !== 'ignored');
    const items: FeedbackItem[] = applied.map(({ email, outcome: { verdict } }) => {
      if (verdict.type === 'ignored') throw new Error('unreachable');
      return {
        emailId: email!.id,
        type: verdict.type === 'delayed' ? 'delivery_delayed' : verdict.type,
        bounceType: verdict.type === 'bounced' ? verdict.bounceType : undefined,
        diagnostic: verdict.diagnostic,
        copy: verdict.copy,
      };
    });
    const results = await applyFeedbackBatch(tx as EntityManager, items, deps.now);
    applied.forEach((p, i) => {
      p.outcome.changed = results[i]?.changed ?? false;
      if (results[i]?.fresh) p.outcome.fresh = true;
    });
    // Customer webhooks (docs/webhooks.md "How it works") are written to the outbox by the
    // recorder, in this transaction; `outcome.event` names the event with the report.
    for (const p of read) done.set(p.id, p.outcome);
    await finishReports(tx as EntityManager, [...done].map(([id, outcome]) => ({ id, outcome })), deps.now);
    return { outcomes: done, items, results };
  });
  countFeedback(deps.metrics, items, results);
  if (deps.metrics) for (const outcome of outcomes.values()) deps.metrics.inboundReports.inc({ outcome: metricOutcome(outcome) });
  return outcomes;
}

function matchEmail(
  byToken: ReportEmail | undefined,
  rcptTo: string,
  originalMessageId: string | null,
  byMessageIds: Map<string, ReportEmail>,
  bounceDomain: string,
): { email?: ReportEmail; reason?: string } {
  if (!byToken || !byToken.message_id) return { reason: 'the return path names no email that was sent' };
  const host = rcptTo.slice(rcptTo.lastIndexOf('@') + 1).toLowerCase();
  const fromDomain = mailboxDomain(byToken.from_address);
  if (host !== returnPathHost(fromDomain, true, bounceDomain) && host !== bounceDomain.toLowerCase()) {
    return { reason: `the return path's host ${host.slice(0, 100)} is not the email's` };
  }
  if (!originalMessageId || originalMessageId === byToken.message_id) return { email: byToken };
  const byMessageId = byMessageIds.get(originalMessageId);
  if (byMessageId?.message_id && byMessageId.organization_id === byToken.organization_id) return { email: byMessageId };
  return { reason: 'the returned message is not an email of the organization the return path names' };
}

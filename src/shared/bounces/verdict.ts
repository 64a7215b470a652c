import type { ReadReport, RecipientStatus } from './report.js';

/** What a report means for the email it was matched to (contract 18a). */
export type Verdict =
  | { type: 'bounced'; bounceType: 'hard' | 'soft'; diagnostic: string }
  | { type: 'complained'; diagnostic: string }
  | { type: 'delayed'; diagnostic: string }
  | { type: 'ignored'; reason: string };

export interface MatchedEmail {
  /** The bare, lower-cased `to` address: the one the outcome recorder acts on. */
  to: string;
  /** The email has `cc` or `bcc` recipients: a report must then name the `to` address. */
  hasCopies: boolean;
}

const DIAGNOSTIC_MAX = 1_000;

/**
 * - DSN: `Action: failed` with a 5.x.x status is a hard bounce, 4.x.x a soft one;
 *   `Action: delayed` is a delay; other actions (delivered, relayed, expanded) change nothing.
 * - ARF: `Feedback-Type: abuse` is a complaint; other feedback types change nothing.
 * - Unstructured, from a mailer-daemon: soft, unless the text carries a 5.x.x status or 550.
 * The outcome recorder acts on the email's `to` address, so a report about a copy recipient
 * (cc, bcc) of the email is ignored rather than applied to the wrong address.
 */
export function verdictOf(report: ReadReport, email: MatchedEmail): Verdict {
  if (report.loop) return { type: 'ignored', reason: 'the returned message is itself a bounce or report' };
  const content = report.content;
  switch (content.kind) {
    case 'unreadable':
      return { type: 'ignored', reason: content.reason };
    case 'dsn': {
      const named = content.recipients.filter((r) => r.finalRecipient === email.to || r.originalRecipient === email.to);
      if (named.length === 0 && email.hasCopies) return { type: 'ignored', reason: 'the report names no `to` recipient of the email' };
      const blocks = named.length > 0 ? named : content.recipients;
      const failed = blocks.find((r) => r.action === 'failed');
      if (failed) return { type: 'bounced', bounceType: severity(failed) === '4' ? 'soft' : 'hard', diagnostic: diagnosticOf(failed) };
      const delayed = blocks.find((r) => r.action === 'delayed');
      if (delayed) return { type: 'delayed', diagnostic: diagnosticOf(delayed) };
      return { type: 'ignored', reason: `action ${blocks[0]?.action || 'missing'} is not a failure` };
    }
    case 'arf': {
      if (content.feedbackType !== 'abuse') return { type: 'ignored', reason: `feedback type ${content.feedbackType.slice(0, 40)} is not a complaint` };
      if (email.hasCopies && content.recipient !== null && content.recipient !== email.to) {
        return { type: 'ignored', reason: 'the report names no `to` recipient of the email' };
      }
      return { type: 'complained', diagnostic: 'Feedback-Type: abuse' };
    }
    case 'unstructured': {
      if (!content.fromDaemon) return { type: 'ignored', reason: 'not a report, and not from a mailer-daemon' };
      const hard = content.status?.startsWith('5') ?? false;
      return { type: 'bounced', bounceType: hard ? 'hard' : 'soft', diagnostic: lineWith(content.text, content.status) };
    }
  }
}

/** The status class: the enhanced status, else the reply code at the start of the diagnostic. */
function severity(block: RecipientStatus): string {
  if (block.status) return block.status[0]!;
  const code = block.diagnostic?.trim()[0];
  return code === '4' ? '4' : '5';
}

function diagnosticOf(block: RecipientStatus): string {
  const diagnostic = block.diagnostic ?? '';
  // The enhanced status first when the diagnostic does not repeat it (Exim writes 5.0.0 and
  // keeps the remote's 5.1.1 in the diagnostic: both are kept).
  const text = block.status && !diagnostic.includes(block.status) ? `${block.status} ${diagnostic}` : diagnostic;
  return (text.trim() || 'no diagnostic').slice(0, DIAGNOSTIC_MAX);
}

/** The line of an unstructured bounce that carries its status, as the diagnostic. */
function lineWith(text: string, status: string | null): string {
  const needle = status === '5.0.0' && !text.includes('5.0.0') ? '550' : status;
  if (needle) {
    const at = text.indexOf(needle);
    if (at >= 0) {
      const start = text.lastIndexOf('\n', at) + 1;
      const end = text.indexOf('\n', at);
      return text.slice(start, end < 0 ? undefined : end).trim().slice(0, DIAGNOSTIC_MAX);
    }
  }
  return 'unstructured bounce without a status';
}

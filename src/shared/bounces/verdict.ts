import type { ReadReport, RecipientStatus } from './report.js';

/** What a report means for the email it was matched to (docs/outcomes.md "Bounces and complaints by mail"). */
export type Verdict =
  | { type: 'bounced'; bounceType: 'hard' | 'soft'; diagnostic: string; copy?: string }
  | { type: 'complained'; diagnostic: string; copy?: string }
  | { type: 'delayed'; diagnostic: string; copy?: string }
  | { type: 'ignored'; reason: string };

export interface MatchedEmail {
  /** The bare, lower-cased `to` address. */
  to: string;
  /**
   * The bare, lower-cased `cc` and `bcc` addresses. When there are any, a report must name
   * the recipient it is about: the `to`, or one of these (`copy` in the verdict).
   */
  copies: readonly string[];
}

const DIAGNOSTIC_MAX = 1_000;

/**
 * Which recipient of the email a report or a provider event is about, by the (bare, lower-cased)
 * address it names (docs/outcomes.md "Copy recipients"): the `to` ({}) when the email has no
 * copies (forwarded mail names where it went), when it names none (null) or names the `to`; a
 * copy when it names one; undefined (no recipient of the email: ignored) when it names another
 * address on an email with copies, where applying it to the `to` could suppress the wrong one.
 */
export function aboutRecipient(named: string | null, email: MatchedEmail): { copy?: string } | undefined {
  if (email.copies.length === 0 || named === null || named === email.to) return {};
  return email.copies.includes(named) ? { copy: named } : undefined;
}

/**
 * - DSN: `Action: failed` with a 5.x.x status is a hard bounce, 4.x.x a soft one;
 *   `Action: delayed` is a delay; other actions (delivered, relayed, expanded) change nothing.
 * - ARF: `Feedback-Type: abuse` is a complaint; other feedback types change nothing.
 * - Unstructured, from a mailer-daemon: soft, unless the text carries a 5.x.x status or 550;
 *   ignored when the email has copies (it names no recipient to apply it to).
 * A report about a copy recipient (cc, bcc) names it as `copy`: the recorder then acts on
 * that address and leaves the email's status, which follows its `to` (docs/outcomes.md). A
 * report of an email with copies that names none of its recipients is ignored rather than
 * applied to the wrong address.
 */
export function verdictOf(report: ReadReport, email: MatchedEmail): Verdict {
  if (report.loop) return { type: 'ignored', reason: 'the returned message is itself a bounce or report' };
  const content = report.content;
  switch (content.kind) {
    case 'unreadable':
      return { type: 'ignored', reason: content.reason };
    case 'dsn': {
      const names = (r: RecipientStatus, address: string) => r.finalRecipient === address || r.originalRecipient === address;
      let blocks = content.recipients.filter((r) => names(r, email.to));
      let copy: string | undefined;
      if (blocks.length === 0 && email.copies.length > 0) {
        // About a copy: the first copy recipient it names (a failure before a delay).
        const aboutCopies = content.recipients.filter((r) => email.copies.some((c) => names(r, c)));
        const first = aboutCopies.find((r) => r.action === 'failed') ?? aboutCopies.find((r) => r.action === 'delayed') ?? aboutCopies[0];
        if (!first) return { type: 'ignored', reason: 'the report names no recipient of the email' };
        copy = email.copies.find((c) => names(first, c))!;
        blocks = [first];
      }
      if (blocks.length === 0) blocks = content.recipients;
      const about = copy ? { copy } : {};
      const failed = blocks.find((r) => r.action === 'failed');
      if (failed) return { type: 'bounced', bounceType: severity(failed) === '4' ? 'soft' : 'hard', diagnostic: diagnosticOf(failed), ...about };
      const delayed = blocks.find((r) => r.action === 'delayed');
      if (delayed) return { type: 'delayed', diagnostic: diagnosticOf(delayed), ...about };
      return { type: 'ignored', reason: `action ${blocks[0]?.action || 'missing'} is not a failure` };
    }
    case 'arf': {
      if (content.feedbackType !== 'abuse') return { type: 'ignored', reason: `feedback type ${content.feedbackType.slice(0, 40)} is not a complaint` };
      const about = aboutRecipient(content.recipient, email);
      if (!about) return { type: 'ignored', reason: 'the report names no recipient of the email' };
      return { type: 'complained', diagnostic: 'Feedback-Type: abuse', ...about };
    }
    case 'unstructured': {
      if (!content.fromDaemon) return { type: 'ignored', reason: 'not a report, and not from a mailer-daemon' };
      // It names no recipient in a form we can trust (its text may quote the message's To and Cc):
      // with copies, applying it to the `to` could suppress the wrong address, as for a DSN that
      // names none of the email's recipients.
      if (email.copies.length > 0) return { type: 'ignored', reason: 'an unstructured bounce names no recipient, and the email has copies' };
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

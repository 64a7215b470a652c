import type { SendMailOptions } from 'nodemailer';
import { parseMailbox } from '../emails/addresses.js';
import type { SubmittedParts } from './queries.js';

/**
 * How the send path hands over a submitted message (docs/smtp.md): to its envelope
 * recipients (RCPT TO, less suppressed ones), with its own headers (less Bcc) and its
 * attachments byte for byte. From, Reply-To and Subject come from the email row; To, Cc
 * and the rest from the kept headers, so a Bcc recipient or an envelope-only recipient
 * never shows in them. DKIM and tracking are added by the send path as for API email.
 */
export function withSubmittedParts(mail: SendMailOptions, parts: SubmittedParts): SendMailOptions {
  const headers: Record<string, string | string[]> = {};
  for (const [name, value] of parts.headers) {
    const key = name.toLowerCase();
    const seen = headers[key];
    headers[key] = seen === undefined ? value : [...(Array.isArray(seen) ? seen : [seen]), value];
  }
  const alternatives = parts.attachments.filter((a) => a.disposition === 'alternative');
  const amp = alternatives.find((a) => a.contentType.startsWith('text/x-amp-html'));
  const from = typeof mail.from === 'string' ? (parseMailbox(mail.from)?.address ?? mail.from) : undefined;
  return {
    ...mail,
    to: undefined,
    cc: undefined,
    bcc: undefined,
    // Extra headers of the email row (none today for submitted mail) win over the submitted ones.
    headers: { ...headers, ...(mail.headers as Record<string, string> | undefined) },
    envelope: { from: from ?? false, to: parts.envelopeTo },
    // An AMP part goes back before the HTML (clients that show only the last part they
    // know must find the HTML last), a calendar invitation after it (message.ts).
    amp: amp?.content,
    alternatives: alternatives.filter((a) => a !== amp).map((a) => ({ contentType: a.contentType, content: a.content })),
    attachments: parts.attachments.filter((a) => a.disposition !== 'alternative').map((a) => ({
      // None given, none sent (nodemailer would make up `attachment-1.*`).
      filename: a.filename ?? (false as const),
      contentType: a.contentType,
      contentDisposition: a.disposition as 'attachment' | 'inline',
      cid: a.contentId ?? undefined,
      content: a.content,
    })),
  };
}

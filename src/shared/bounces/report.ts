import { simpleParser, type Attachment } from 'mailparser';
import { bareAddress, bareMessageId, parseFieldBlocks, parseHeaderBlock, type Fields } from './fields.js';

/** One recipient block of an RFC 3464 delivery status notification. */
export interface RecipientStatus {
  action: string;
  /** RFC 3463 enhanced status (`5.1.1`), or null when absent or malformed. */
  status: string | null;
  finalRecipient: string | null;
  originalRecipient: string | null;
  diagnostic: string | null;
}

/** What a report says, before it is matched to an email. */
export type ReportContent =
  | { kind: 'dsn'; recipients: RecipientStatus[] }
  | { kind: 'arf'; feedbackType: string; recipient: string | null }
  | { kind: 'unstructured'; fromDaemon: boolean; status: string | null; text: string }
  | { kind: 'unreadable'; reason: string };

export interface ReadReport {
  content: ReportContent;
  /** The Message-ID of the returned (bounced or reported) message, when the report carries its headers. */
  originalMessageId: string | null;
  /** The returned message is itself a bounce or a report: a bounce of a bounce, never acted on. */
  loop: boolean;
}

const ENHANCED_STATUS = /^[245]\.\d{1,3}\.\d{1,3}$/;
// Over user text: one character class and fixed repetition counts, so linear in the text.
const STATUS_IN_TEXT = /\b([245])\.\d{1,3}\.\d{1,3}\b/g;
const REPLY_550 = /\b550\b/;
/** Unstructured bounces are read from their first part of text only. */
const TEXT_LIMIT = 64 * 1024;
const DAEMON_LOCAL_PARTS = new Set(['mailer-daemon', 'postmaster', 'mail-daemon', 'mailerdaemon', 'mdaemon']);

/**
 * Reads a bounce or complaint message (contract 18a): an RFC 3464 DSN (a
 * `message/delivery-status` part), an RFC 5965 ARF report (`message/feedback-report`), or else
 * the text of an unstructured mailer-daemon bounce. mailparser parses the MIME structure; the
 * report parts themselves are header-style blocks (fields.ts). `mailFrom` is the SMTP envelope
 * sender (`''` for the null sender `<>` that every DSN carries).
 */
export async function readReport(raw: Buffer, mailFrom: string): Promise<ReadReport> {
  let mail;
  try {
    mail = await simpleParser(raw, {
      // The report parts as attachments, embedded messages unparsed: we read their headers only.
      keepDeliveryStatus: true,
      ignoreEmbedded: true,
      skipHtmlToText: true,
      skipTextToHtml: true,
      skipImageLinks: true,
      skipTextLinks: true,
      checksumAlgo: false,
    });
  } catch (error) {
    return { content: { kind: 'unreadable', reason: `malformed MIME: ${(error as Error).message}`.slice(0, 200) }, originalMessageId: null, loop: false };
  }
  const parts = mail.attachments;
  const returned = parts.find((a) => a.contentType === 'message/rfc822' || a.contentType === 'text/rfc822-headers' || a.contentType === 'message/rfc822-headers');
  const returnedHeaders = returned ? parseHeaderBlock(partText(returned)) : undefined;
  const originalMessageId = bareMessageId(returnedHeaders?.get('message-id'));
  const loop = returnedHeaders ? isAutomatic(returnedHeaders) : false;

  const status = parts.find((a) => a.contentType === 'message/delivery-status' || a.contentType === 'message/global-delivery-status');
  if (status) {
    // The first block is per message (Reporting-MTA, ...), the others one per recipient.
    const recipients = parseFieldBlocks(partText(status))
      .filter((block) => block.has('action'))
      .map(recipientStatus);
    if (recipients.length === 0) return { content: { kind: 'unreadable', reason: 'delivery-status part without a recipient' }, originalMessageId, loop };
    return { content: { kind: 'dsn', recipients }, originalMessageId, loop };
  }

  const feedback = parts.find((a) => a.contentType === 'message/feedback-report');
  if (feedback) {
    const [fields] = parseFieldBlocks(partText(feedback), 1);
    const feedbackType = fields?.get('feedback-type')?.toLowerCase();
    if (!feedbackType) return { content: { kind: 'unreadable', reason: 'feedback-report part without Feedback-Type' }, originalMessageId, loop };
    return { content: { kind: 'arf', feedbackType, recipient: bareAddress(fields?.get('original-rcpt-to')) }, originalMessageId, loop };
  }

  const text = (mail.text ?? '').slice(0, TEXT_LIMIT);
  const from = mail.from?.value[0]?.address?.toLowerCase() ?? '';
  const fromDaemon = mailFrom === '' || DAEMON_LOCAL_PARTS.has(from.slice(0, from.indexOf('@')));
  return { content: { kind: 'unstructured', fromDaemon, status: statusInText(text), text }, originalMessageId, loop };
}

function partText(part: Attachment): string {
  // Report parts are 7-bit text; a part larger than this is not a report we can use.
  return part.content.toString('utf8', 0, Math.min(part.content.length, 256 * 1024));
}

function recipientStatus(block: Fields): RecipientStatus {
  const status = block.get('status')?.split(/\s/)[0] ?? '';
  const diagnostic = block.get('diagnostic-code');
  return {
    action: (block.get('action') ?? '').toLowerCase(),
    status: ENHANCED_STATUS.test(status) ? status : null,
    finalRecipient: bareAddress(block.get('final-recipient')),
    originalRecipient: bareAddress(block.get('original-recipient')),
    diagnostic: diagnostic ? diagnostic.replace(/^[a-z-]+;\s*/i, '').slice(0, 1_000) : null,
  };
}

/** The most severe enhanced status in a text (5 before 4), or `5.0.0` for a bare 550 reply. */
function statusInText(text: string): string | null {
  let found: string | null = null;
  for (const match of text.matchAll(STATUS_IN_TEXT)) {
    if (match[1] === '5') return match[0];
    found ??= match[0];
  }
  if (REPLY_550.test(text)) return '5.0.0';
  return found;
}

/** The returned message was itself automatic mail (a bounce or a report), not ours. */
function isAutomatic(headers: Fields): boolean {
  const type = headers.get('content-type')?.toLowerCase() ?? '';
  if (type.startsWith('multipart/report')) return true;
  const auto = headers.get('auto-submitted')?.toLowerCase();
  if (auto && auto !== 'no') return true;
  // A null envelope sender marks a DSN (RFC 3464 section 2.1): our own mail never has one.
  return headers.get('return-path')?.replace(/\s/g, '') === '<>';
}

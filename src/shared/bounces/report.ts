import type { Attachment, ParsedMail } from 'mailparser';
import { storableText } from '../storable.js';
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
const DAEMON_LOCAL_PARTS = new Set(['mailer-daemon', 'mailer_daemon', 'postmaster', 'mail-daemon', 'mailerdaemon', 'mdaemon']);
// Exchange's system mailbox (`MicrosoftExchange329e71ec…@`).
const DAEMON_LOCAL_PREFIX = 'microsoftexchange';
// The names MTAs give their bounces' From (`Mail Delivery Subsystem <MAILER-DAEMON@...>`).
const DAEMON_NAME = /^(?:mail delivery (?:sub)?system|mail delivery service|mailer-daemon|postmaster|mail administrator|system administrator)$/i;
// RFC 3834 auto-replies and the markers responders add besides (Exchange's out-of-office,
// Sieve's vacation, webmail responders), read only when the From is no daemon's.
const AUTO_REPLY_HEADERS = ['x-autoreply', 'x-autorespond', 'x-auto-response-suppress'];
const AUTO_REPLY_SUBJECT = /^\s*(?:auto(?:matic)?[ -]?(?:reply|response)|out of (?:the )?office|auto:|away:)/i;
// Where an unstructured bounce's own words end and its copy of the returned message begins:
// the separators qmail, Exim, sendmail, Postfix and webmail bounces write, or the first line
// of a quoted header block. A status or a 550 in the copy is the customer's text (a version
// number, a subject), not the bounce's.
const QUOTED_COPY =
  /^[ \t>-]*(?:below this line is a copy of the message|this is a copy of the (?:body of the )?message|original message|undelivered message|returned message|(?:received|return-path|message-id|dkim-signature):)/im;

/**
 * Reads a bounce or complaint message (docs/outcomes.md "Bounces and complaints by mail"): an RFC
 * 3464 DSN (a `message/delivery-status` part), an RFC 5965 ARF report (`message/feedback-report`),
 * or else the text of an unstructured mailer-daemon bounce. mailparser parses the MIME structure;
 * the report parts themselves are header-style blocks (fields.ts). `mailFrom` is the SMTP envelope
 * sender (`''` for the null sender `<>` that every DSN carries).
 */
export async function readReport(raw: Buffer, mailFrom: string): Promise<ReadReport> {
  const text = withoutNul(raw);
  return readDsnDirectly(text) ?? readWithMailparser(text, mailFrom);
}

const REPLACEMENT = Buffer.from('\ufffd');

/**
 * The report with each NUL byte as U+FFFD: what is read from it (a diagnostic, an id, an
 * address) is written to PostgreSQL, which stores no NUL, and a remote server may write one.
 * Else the report, and every other report of its job, failed on each try.
 */
function withoutNul(raw: Buffer): Buffer {
  if (!raw.includes(0)) return raw;
  const parts: Buffer[] = [];
  let from = 0;
  for (let at = raw.indexOf(0); at !== -1; at = raw.indexOf(0, from)) {
    parts.push(raw.subarray(from, at), REPLACEMENT);
    from = at + 1;
  }
  parts.push(raw.subarray(from));
  return Buffer.concat(parts);
}

/** The parts of a message a report is read from, whichever way they were found. */
interface ReportParts {
  /** The returned message or its headers (`message/rfc822`, `text/rfc822-headers`). */
  returned: string | undefined;
  /** The `message/delivery-status` part. */
  status: string | undefined;
}

/** What a report says of the returned message, from its headers when it carries them. */
function returnedMessage(returned: string | undefined): Pick<ReadReport, 'originalMessageId' | 'loop'> {
  const headers = returned !== undefined ? parseHeaderBlock(returned) : undefined;
  return { originalMessageId: bareMessageId(headers?.get('message-id')), loop: headers ? isAutomatic(headers) : false };
}

/** A DSN, read from its parts; undefined without a delivery-status part. */
function fromParts(parts: ReportParts): ReadReport | undefined {
  if (parts.status === undefined) return undefined;
  const { originalMessageId, loop } = returnedMessage(parts.returned);
  // The first block is per message (Reporting-MTA, ...), the others one per recipient.
  const recipients = parseFieldBlocks(parts.status)
    .filter((block) => block.has('action'))
    .map(recipientStatus);
  if (recipients.length === 0) return { content: { kind: 'unreadable', reason: 'delivery-status part without a recipient' }, originalMessageId, loop };
  return { content: { kind: 'dsn', recipients }, originalMessageId, loop };
}

const PLAIN_ENCODINGS = new Set(['', '7bit', '8bit', 'binary']);
const BOUNDARY = /;\s*boundary\s*=\s*(?:"([^"]{1,200})"|([^;\s"]{1,200}))/i;
const STATUS_TYPES = new Set(['message/delivery-status', 'message/global-delivery-status']);
const RETURNED_TYPES = new Set(['message/rfc822', 'text/rfc822-headers', 'message/rfc822-headers']);

/**
 * The common case read without a MIME parser: an RFC 3464 DSN (a top-level
 * `multipart/report; report-type=delivery-status`) whose parts are plain 7/8-bit text, as
 * Postfix, Exim, Sendmail and Exchange write them. Its parts are split at the boundary and
 * read by the same field reader as mailparser's output (parsing the whole MIME tree was most
 * of a worker's time per report). Anything else (no boundary, no closing delimiter, an
 * encoded report part, an ARF report, an unstructured bounce) returns undefined and goes to
 * mailparser; a test checks that both ways read the fixtures alike.
 */
export function readDsnDirectly(raw: Buffer): ReadReport | undefined {
  if (raw.length > 1024 * 1024) return undefined;
  const text = raw.toString('latin1');
  const headerEnd = text.search(/\r?\n\r?\n/);
  if (headerEnd < 0) return undefined;
  const headers = parseHeaderBlock(text.slice(0, headerEnd));
  const type = headers.get('content-type') ?? '';
  if (!/^multipart\/report\s*;/i.test(type) || !/report-type\s*=\s*"?delivery-status"?/i.test(type)) return undefined;
  const match = BOUNDARY.exec(type);
  const boundary = match?.[1] ?? match?.[2];
  if (!boundary) return undefined;
  const delimiter = `\n--${boundary}`;
  const body = text.slice(headerEnd);
  const close = body.indexOf(`${delimiter}--`);
  if (close < 0) return undefined;
  const parts: ReportParts = { returned: undefined, status: undefined };
  let at = body.indexOf(delimiter);
  while (at >= 0 && at < close) {
    const start = body.indexOf('\n', at + delimiter.length);
    const next = body.indexOf(delimiter, at + delimiter.length);
    if (start < 0 || next < 0) return undefined;
    const part = body.slice(start + 1, next);
    const partHeaderEnd = part.search(/(^|\r?\n)\r?\n/);
    const partHeaders = parseHeaderBlock(partHeaderEnd < 0 ? part : part.slice(0, partHeaderEnd));
    const partType = (partHeaders.get('content-type') ?? 'text/plain').split(';')[0]!.trim().toLowerCase();
    if (STATUS_TYPES.has(partType) || RETURNED_TYPES.has(partType)) {
      if (!PLAIN_ENCODINGS.has((partHeaders.get('content-transfer-encoding') ?? '').trim().toLowerCase())) return undefined;
      const content = partHeaderEnd < 0 ? '' : part.slice(partHeaderEnd).replace(/^(\r?\n)+/, '');
      // The CRLF before a delimiter belongs to the delimiter (RFC 2046 5.1.1).
      const partBody = Buffer.from(content.endsWith('\r') ? content.slice(0, -1) : content, 'latin1').toString('utf8', 0, 256 * 1024);
      if (STATUS_TYPES.has(partType)) parts.status ??= partBody;
      else parts.returned ??= partBody;
    }
    at = next;
  }
  return fromParts(parts);
}

/** The general reader: any MIME structure, parsed by mailparser. */
export async function readWithMailparser(raw: Buffer, mailFrom: string): Promise<ReadReport> {
  // Loaded by the first report that needs it (those of the fast reader above need none): a
  // worker that never meets one does not hold mailparser and its charset tables. Outside the
  // try: a module that fails to load fails the job (retried), it does not make the report unreadable.
  const { simpleParser } = await import('mailparser');
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
  // A multipart message is cut at its boundary (RFC 2046 5.1.1): without one, or with one its
  // body never uses, no part is found and mailparser reads nothing. Read as an unstructured
  // bounce, its empty text would be a soft bounce whatever its parts said.
  if (headerText(mail, 'content-type')?.startsWith('multipart/') && parts.length === 0 && !mail.text && !mail.html) {
    return { content: { kind: 'unreadable', reason: 'malformed MIME: a multipart message whose parts cannot be found (no boundary, or one never used)' }, originalMessageId: null, loop: false };
  }
  const returned = parts.find((a) => RETURNED_TYPES.has(a.contentType));
  const status = parts.find((a) => STATUS_TYPES.has(a.contentType));
  const returnedText = returned ? partText(returned) : undefined;
  const dsn = fromParts({ returned: returnedText, status: status ? partText(status) : undefined });
  if (dsn) return dsn;
  const { originalMessageId, loop } = returnedMessage(returnedText);

  const feedback = parts.find((a) => a.contentType === 'message/feedback-report');
  if (feedback) {
    const [fields] = parseFieldBlocks(partText(feedback), 1);
    const feedbackType = fields?.get('feedback-type')?.toLowerCase();
    if (!feedbackType) return { content: { kind: 'unreadable', reason: 'feedback-report part without Feedback-Type' }, originalMessageId, loop };
    return { content: { kind: 'arf', feedbackType, recipient: bareAddress(fields?.get('original-rcpt-to')) }, originalMessageId, loop };
  }

  const text = ownText((mail.text ?? '').slice(0, TEXT_LIMIT));
  // A mailer-daemon by its From, or by its null envelope sender unless the message says it is
  // an auto-reply: RFC 3834 auto-replies (an out-of-office, a Sieve vacation) carry a null
  // sender too, from the person, and a "550 Market Street" in their signature is no 550.
  const author = mail.from?.value[0];
  const from = author?.address?.toLowerCase() ?? '';
  const local = from.includes('@') ? from.slice(0, from.lastIndexOf('@')) : from;
  const daemonByFrom = DAEMON_LOCAL_PARTS.has(local) || local.startsWith(DAEMON_LOCAL_PREFIX) || DAEMON_NAME.test(author?.name?.trim() ?? '');
  const fromDaemon = daemonByFrom || (mailFrom === '' && !isAutoReply(mail));
  return { content: { kind: 'unstructured', fromDaemon, status: statusInText(text), text }, originalMessageId, loop };
}

/** A header of a parsed message as text, lower-cased (mailparser keeps some as `{ value }`). */
function headerText(mail: ParsedMail, name: string): string | undefined {
  const value = mail.headers.get(name);
  if (value === undefined) return undefined;
  const text = typeof value === 'object' && value !== null && 'value' in value ? String(value.value) : String(value);
  return text.trim().toLowerCase();
}

/** Whether a message says it is an automatic reply (RFC 3834 `Auto-Submitted`, or a responder's own marks). */
function isAutoReply(mail: ParsedMail): boolean {
  const submitted = headerText(mail, 'auto-submitted');
  if (submitted !== undefined && submitted !== 'no') return true;
  if (AUTO_REPLY_HEADERS.some((name) => mail.headers.has(name))) return true;
  if (headerText(mail, 'precedence') === 'auto_reply') return true;
  return AUTO_REPLY_SUBJECT.test(mail.subject ?? '');
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
    // Cut, then made storable: the cut may split a surrogate pair, which jsonb refuses.
    diagnostic: diagnostic ? storableText(diagnostic.replace(/^[a-z-]+;\s*/i, '').slice(0, 1_000)) : null,
  };
}

/** An unstructured bounce's text up to its quoted copy of the returned message (QUOTED_COPY). */
function ownText(text: string): string {
  const copy = QUOTED_COPY.exec(text);
  return copy ? text.slice(0, copy.index) : text;
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

import { createRequire } from 'node:module';
import { simpleParser, type AddressObject, type EmailAddress, type HeaderLines, type ParsedMail } from 'mailparser';
import type { EmailTag } from '../db/entities/email.js';
import { asciiAddress, isAddress } from '../emails/addresses.js';
import { MAX_NESTING, nestedTooDeep } from '../emails/render.js';
import addressparser from 'nodemailer/lib/addressparser/index.js';
import { replies } from './reply.js';
import { unstorable } from '../storable.js';

/**
 * A message submitted over SMTP, read with mailparser and mapped to one email (contract
 * 19): `to` is the first To address, `cc` the other To and Cc addresses, `bcc` the envelope
 * recipients in neither header; html, text and subject come from the message and
 * `X-Mailroom-Tags: name=value, ...` gives tags. What the delivery needs besides the email
 * row (the envelope, the headers to keep, the attachments) is read here too.
 */

export interface SubmittedAttachment {
  filename: string | null;
  /** The Content-Type as written, parameters included (`charset`, `method`), less `name`. */
  contentType: string;
  /** `alternative`: a body part beside the text and HTML (a calendar invitation), not an attachment. */
  disposition: 'attachment' | 'inline' | 'alternative';
  /** Content-ID without angle brackets (an inline image referred to as `cid:`). */
  contentId: string | null;
  content: Buffer;
}

export interface SubmittedMessage {
  from: string;
  to: string;
  cc: string[] | null;
  bcc: string[] | null;
  replyTo: string[] | null;
  subject: string;
  /** The HTML part, '' when the message has none. */
  html: string;
  text: string | null;
  tags: EmailTag[];
  /** Headers delivered as submitted, in order: [name, value] (see keptHeaders). */
  headers: [string, string][];
  /** Every envelope recipient (RCPT TO), the ones the message is delivered to. */
  envelopeTo: string[];
  /**
   * The other addresses the message says it is sent by or for (`Sender`, `Resent-From`,
   * `Resent-Sender`), by header: the sending policy checks them as it checks From.
   */
  sentBy: { header: string; address: string }[];
  attachments: SubmittedAttachment[];
}

// libmime (mailparser's own MIME helpers) ships no types: the one function used, typed here.
const libmime = createRequire(import.meta.url)('libmime') as { buildHeaderValue(structured: { value: string; params: Record<string, unknown> }): string };

/** RFC 5322 2.1.1: a line is at most 998 characters, CRLF excluded. */
const MAX_LINE = 998;
const MAX_TAGS = 50;
// The API's bound on cc and on reply_to (docs/emails.md "Validation").
const MAX_ADDRESSES = 50;
// Parts that sit beside the text and HTML in multipart/alternative when they come without a
// Content-Disposition: an invitation (RFC 6047, as Outlook, Google Calendar and nodemailer's
// icalEvent write it) and AMP for Email. Delivered as an attachment, clients show no invitation.
const ALTERNATIVE_TYPE = /^text\/(?:calendar|x-amp-html)$/;
// The API's bound on a subject (docs/emails.md "Validation"), in characters once unfolded.
const MAX_SUBJECT = 998;
const TAG_PART = /^[A-Za-z0-9_-]{1,256}$/;

/**
 * Headers not delivered as submitted: the ones the delivery writes itself (From, Subject,
 * Reply-To from the email; To, Cc and Sender re-encoded from their decoded addresses;
 * Message-ID is the service's, docs/emails.md "Transports"), the MIME structure nodemailer rebuilds
 * around the parts, a signature the delivery would break, Bcc (never delivered), the envelope's
 * Return-Path, and the service's own instructions (X-Mailroom-*).
 */
const REPLACED_HEADERS = new Set([
  'from',
  'subject',
  'reply-to',
  'to',
  'cc',
  'bcc',
  'sender',
  'message-id',
  'mime-version',
  'content-type',
  'content-transfer-encoding',
  'content-disposition',
  'content-id',
  'dkim-signature',
  'return-path',
]);
const ADDRESS_HEADERS: Record<string, string> = { to: 'To', cc: 'Cc', sender: 'Sender' };

/** The length of the longest line of `raw` (CR and LF excluded); stops early past `limit`. */
function longestLineOver(raw: Buffer, limit: number): boolean {
  let start = 0;
  for (;;) {
    const lf = raw.indexOf(0x0a, start);
    const end = lf === -1 ? raw.length : lf;
    const length = end - start - (end > start && raw[end - 1] === 0x0d ? 1 : 0);
    if (length > limit) return true;
    if (lf === -1) return false;
    start = lf + 1;
  }
}

/** A display name as a phrase: quoted when it holds anything but letters, digits and atext. */
function phrase(name: string): string {
  return /^[\p{L}\p{N} !#$%&'*+\-/=?^_`{|}~.]+$/u.test(name) ? name : `"${name.replace(/(["\\])/g, '\\$1')}"`;
}

/** `Name <addr>` (the name quoted when it needs to be) or `addr`. */
function formatMailbox(mailbox: { name?: string; address?: string }): string {
  const address = mailbox.address ?? '';
  const name = (mailbox.name ?? '').replace(/[\r\n]+/g, ' ').trim();
  return name ? `${phrase(name)} <${address}>` : address;
}

function formatAddressList(entries: EmailAddress[]): string {
  return entries
    .map((entry) => {
      if (!entry.group) return formatMailbox(entry);
      const name = entry.name.replace(/[\r\n]+/g, ' ').trim();
      return `${name ? phrase(name) : '""'}:${entry.group.length > 0 ? ` ${formatAddressList(entry.group)}` : ''};`;
    })
    .join(', ');
}

function addressObjects(value: AddressObject | AddressObject[] | undefined): AddressObject[] {
  if (!value) return [];
  return Array.isArray(value) ? value : [value];
}

/**
 * An attachment's Content-Type as submitted: its value, lower-cased, and its parameters as
 * written (a charset, an invitation's method) but `name`, which the composer writes from
 * the file name.
 */
function submittedType(attachment: { contentType: string; headers: Map<string, unknown> }): string {
  const header = attachment.headers.get('content-type') as { value?: unknown; params?: Record<string, unknown> } | undefined;
  if (typeof header?.value !== 'string' || !header.value.includes('/')) return attachment.contentType;
  const params = Object.fromEntries(Object.entries(header.params ?? {}).filter(([name, value]) => name !== 'name' && typeof value === 'string' && !/[\r\n]/.test(value)));
  // libmime quotes what needs quoting and encodes non-ASCII values (RFC 2231), as mailparser read them.
  return libmime.buildHeaderValue({ value: header.value.toLowerCase(), params });
}

/** `alternative` for a calendar or AMP part without a Content-Disposition; else as submitted. */
function dispositionOf(attachment: { contentType: string; contentDisposition?: string; filename?: string; headers: Map<string, unknown> }, type: string): SubmittedAttachment['disposition'] {
  if (!attachment.headers.has('content-disposition') && !attachment.filename && ALTERNATIVE_TYPE.test(type.split(';')[0]!)) return 'alternative';
  return attachment.contentDisposition === 'inline' ? 'inline' : 'attachment';
}

/** Mailboxes of an address header, groups flattened; ones that are not an address are left out. */
function mailboxes(value: AddressObject | AddressObject[] | undefined): EmailAddress[] {
  const out: EmailAddress[] = [];
  const walk = (entries: EmailAddress[]) => {
    for (const entry of entries) {
      if (entry.group) walk(entry.group);
      else if (entry.address) {
        const address = asciiAddress(entry.address);
        if (isAddress(address)) out.push({ ...entry, address });
      }
    }
  };
  for (const object of addressObjects(value)) walk(object.value);
  return out;
}

/** A raw header line's value, unfolded; 8-bit text read as UTF-8 (mailparser gives it as latin1). */
function rawValue(line: string): string {
  const colon = line.indexOf(':');
  const value = line.slice(colon + 1).replace(/\r?\n(?=[ \t])/g, '').trim();
  if (!/[^\x00-\x7f]/.test(value)) return value;
  const utf8 = Buffer.from(value, 'latin1').toString('utf8');
  return utf8.includes('\ufffd') ? value : utf8;
}

/** Headers kept as submitted: everything but REPLACED_HEADERS and X-Mailroom-*. */
function keptHeaders(mail: ParsedMail): [string, string][] {
  const kept: [string, string][] = [];
  const lines: HeaderLines = mail.headerLines;
  for (const { key, line } of lines) {
    if (REPLACED_HEADERS.has(key) || key.startsWith('x-mailroom-')) continue;
    kept.push([line.slice(0, line.indexOf(':')).trim(), rawValue(line)]);
  }
  // To, Cc and Sender from their decoded addresses: an encoded name passed on as it was
  // would be quoted by the composer and shown encoded.
  for (const [key, name] of Object.entries(ADDRESS_HEADERS)) {
    const objects = addressObjects(mail.headers.get(key) as AddressObject | AddressObject[] | undefined);
    const entries = objects.flatMap((o) => o.value);
    if (entries.length > 0) kept.push([name, formatAddressList(entries)]);
  }
  return kept;
}

function tagsOf(mail: ParsedMail): EmailTag[] {
  const tags: EmailTag[] = [];
  for (const { key, line } of mail.headerLines) {
    if (key !== 'x-mailroom-tags') continue;
    for (const item of rawValue(line).split(',')) {
      const pair = item.trim();
      if (!pair) continue;
      const eq = pair.indexOf('=');
      const name = eq === -1 ? pair : pair.slice(0, eq).trim();
      const value = eq === -1 ? '' : pair.slice(eq + 1).trim();
      if (!TAG_PART.test(name) || !TAG_PART.test(value)) {
        throw replies.malformed(`X-Mailroom-Tags: "${pair.slice(0, 100)}" is not name=value of 1 to 256 ASCII letters, digits, _ or -`);
      }
      tags.push({ name, value });
    }
  }
  if (tags.length > MAX_TAGS) throw replies.malformed(`X-Mailroom-Tags: at most ${MAX_TAGS} tags`);
  return tags;
}

// Text PostgreSQL cannot store (a NUL; an unpaired surrogate, which a UTF-16 part can decode to).
const unstorableText = (value: string | null | undefined) => value !== null && value !== undefined && unstorable(value);

/**
 * Reads a message as received after DATA. Throws an SmtpReplyError (554 5.6.0) for a
 * message that cannot become an email: a line over 998 characters, no parseable From with
 * exactly one address, bad tags, NUL characters in text.
 */
export async function readSubmittedMessage(raw: Buffer, envelopeTo: string[]): Promise<SubmittedMessage> {
  if (longestLineOver(raw, MAX_LINE)) throw replies.malformed(`Message has a line longer than ${MAX_LINE} characters (RFC 5322 2.1.1)`);
  let mail: ParsedMail;
  try {
    mail = await simpleParser(raw, { keepCidLinks: true, skipHtmlToText: true, skipTextToHtml: true, skipTextLinks: true });
  } catch {
    throw replies.malformed('Message could not be parsed as MIME');
  }
  const fromList = mailboxes(mail.from);
  if (addressObjects(mail.from).flatMap((o) => o.value).length !== 1 || fromList.length !== 1) {
    throw replies.malformed('Message must have a From header with exactly one valid address');
  }
  const from = formatMailbox(fromList[0]!);
  // Unfolded, the API's bound (docs/emails.md "Validation"): a folded Subject may run past it with no line
  // over 998. A message without one is taken with an empty subject (RFC 5322 makes it optional).
  const subject = (mail.subject ?? '').replace(/[\r\n]+/g, ' ');
  if (subject.length > MAX_SUBJECT) throw replies.malformed(`Subject is longer than ${MAX_SUBJECT} characters (the API's limit)`);
  const html = typeof mail.html === 'string' ? mail.html : '';
  // The parser gives an empty text for a message with no text part: null, as html is then.
  const text = mail.text === '' && html ? null : (mail.text ?? null);
  // A multipart body is cut at its boundary (RFC 2046 5.1.1 makes the parameter mandatory):
  // without one no part of it can be found and the parser reads nothing, so taken the message
  // would be sent empty. Refused when that is what happened (nothing was read, and such a
  // Content-Type is there, the message's own or a part's), not for a message that is simply empty.
  if (!html && !text && mail.attachments.length === 0) {
    const unbounded = unboundedMultipart(raw);
    if (unbounded?.top) throw replies.malformed(`Content-Type ${unbounded.type} has no boundary parameter (RFC 2046 5.1.1)`);
    if (unbounded) throw replies.malformed('Message has a multipart part without its boundary parameter (RFC 2046 5.1.1): no part of it could be read');
  }
  if (unstorableText(subject) || unstorableText(html) || unstorableText(text)) throw replies.malformed('Message text contains NUL characters or unpaired surrogates');
  // As the API's html: tracking parses it, and parsers are not linear in the nesting.
  if (html && nestedTooDeep(html)) throw replies.malformed(`Message HTML is nested deeper than ${MAX_NESTING} elements`);
  const tags = tagsOf(mail);

  // The mapping of docs/smtp.md "From a message to an email". Without any To address
  // (`To: undisclosed-recipients:;`), `to` is the first Cc address, or else the first envelope recipient.
  const toList = mailboxes(mail.to);
  const ccList = mailboxes(mail.cc);
  const inHeaders = new Set([...toList, ...ccList].map((m) => m.address!.toLowerCase()));
  const envelopeOnly = envelopeTo.filter((address) => !inHeaders.has(address.toLowerCase()));
  const listed = [...toList, ...ccList].map(formatMailbox);
  const to = listed.shift() ?? envelopeOnly.shift()!;
  const replyTo = mailboxes(mail.replyTo).map(formatMailbox);
  // The API's bounds (docs/emails.md "Validation"): what the API refuses is not taken over SMTP either.
  if (listed.length > MAX_ADDRESSES) throw replies.malformed(`To and Cc: at most ${MAX_ADDRESSES + 1} addresses (the API's to and cc)`);
  if (replyTo.length > MAX_ADDRESSES) throw replies.malformed(`Reply-To: at most ${MAX_ADDRESSES} addresses (the API's reply_to)`);

  const attachments = mail.attachments.map((a): SubmittedAttachment => {
    // The type the client wrote: mailparser replaces application/octet-stream by one guessed from the file name.
    const contentType = submittedType(a) || 'application/octet-stream';
    return { filename: a.filename ?? null, contentType, disposition: dispositionOf(a, contentType), contentId: a.cid ?? null, content: a.content };
  });
  const headers = keptHeaders(mail);
  if (headers.some(([name, value]) => unstorableText(name) || unstorableText(value)) || attachments.some((a) => unstorableText(a.filename) || unstorableText(a.contentType) || unstorableText(a.contentId))) {
    throw replies.malformed('Message headers contain NUL characters or unpaired surrogates');
  }
  return {
    from,
    to,
    cc: listed.length > 0 ? listed : null,
    bcc: envelopeOnly.length > 0 ? envelopeOnly : null,
    replyTo: replyTo.length > 0 ? replyTo : null,
    subject,
    html,
    text,
    tags,
    headers,
    envelopeTo,
    attachments,
    sentBy: sentByOf(mail),
  };
}

const SENT_BY_HEADERS: Record<string, string> = { sender: 'Sender', 'resent-from': 'Resent-From', 'resent-sender': 'Resent-Sender' };

function sentByOf(mail: ParsedMail): { header: string; address: string }[] {
  const out: { header: string; address: string }[] = [];
  for (const { key, line } of mail.headerLines) {
    const header = SENT_BY_HEADERS[key];
    if (!header) continue;
    for (const entry of addressparser(rawValue(line), { flatten: true })) {
      // A value that names no address still names a domain the policy must see: it is refused as given.
      out.push({ header, address: entry.address ? asciiAddress(entry.address) : rawValue(line) });
    }
  }
  return out;
}

// A Content-Type header field of a multipart type, unfolded over its continuation lines.
const MULTIPART_FIELD = /^content-type:[ \t]*multipart\/[^\r\n]*(?:\r?\n[ \t][^\r\n]*)*/gim;

/**
 * The first multipart Content-Type of the message (its own, `top`, or a part's) without a
 * boundary parameter (or with an empty one), with its type.
 */
function unboundedMultipart(raw: Buffer): { type: string; top: boolean } | undefined {
  const text = raw.toString('latin1');
  const headerEnd = text.search(/\r?\n\r?\n/);
  for (const { 0: field, index } of text.matchAll(MULTIPART_FIELD)) {
    if (/;\s*boundary\s*=\s*(?:"[^"]+"|[^\s;"]+)/i.test(field)) continue;
    const type = /multipart\/[^\s;]*/i.exec(field)![0].toLowerCase().slice(0, 100);
    return { type, top: headerEnd === -1 || index < headerEnd };
  }
  return undefined;
}

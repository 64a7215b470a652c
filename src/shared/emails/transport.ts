import { mkdir, rename, writeFile } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import nodemailer, { type SendMailOptions } from 'nodemailer';
import type DKIM from 'nodemailer/lib/dkim/index.js';
import SMTPPool from 'nodemailer/lib/smtp-pool/index.js';
import type { Config } from '../config.js';
import type { Logger } from '../logger.js';
import { randomHex } from '../crypto.js';
import { withSubmittedParts } from '../submission/delivery.js';
import type { SubmittedParts } from '../submission/queries.js';
import { composeMessage, type Composed } from './compose.js';
import { dkimSign, type DkimKey } from './dkim-sign.js';

/** One message as handed to the provider. */
export interface OutgoingMessage {
  /** The email id: names the .eml file of the file transport. */
  id: string;
  /** Whose domain key signs it (sending domains belong to an organization). */
  organizationId: string;
  from: string;
  to: string;
  cc?: string[] | null;
  bcc?: string[] | null;
  replyTo?: string[] | null;
  subject: string;
  html: string;
  text: string;
  /** Without angle brackets: `{email id}@{from domain}`. */
  messageId: string;
  /** Domain of the From address; selects the DKIM key. */
  fromDomain: string;
  headers?: Record<string, string>;
  /**
   * Bare, lower-cased addresses left out of the SMTP envelope (suppressed recipients): the
   * headers keep what the sender wrote, but only the other recipients are given the message.
   */
  skipRecipients?: readonly string[];
  /**
   * Awaited right before the message is committed (SMTP: before the final `.` of DATA, so
   * the relay cannot have it yet); when it throws, the hand-over is aborted and the relay
   * discards the message.
   */
  beforeCommit?: () => Promise<void>;
  /** A message submitted over SMTP: its envelope, headers and attachments (src/shared/submission). */
  submitted?: SubmittedParts;
  /**
   * Called synchronously once `beforeCommit` resolved, right before the message is
   * committed (SMTP: in the turn of the event loop that writes the final `.`).
   */
  onCommit?: () => void;
  /** Called synchronously when the provider's acceptance is read, before `send` resolves. */
  onAccepted?: () => void;
}

export interface SendResult {
  /** True when the transport itself is the final destination (file): the email reads `delivered`. */
  delivered: boolean;
  response?: string;
  /**
   * Recipients the relay refused (at RCPT) while it took the message for the others: their
   * envelope addresses and the relay's answer to each.
   */
  refused?: { address: string; reason: string }[];
}

/**
 * Where a DKIM signer plugs in (docs/domains.md "DKIM signing"): given the From domain and the
 * organization, the key to sign with, or undefined to send unsigned. The domains module provides it
 * (src/shared/container.ts).
 */
export type DkimResolver = (fromDomain: string, organizationId: string) => Promise<DKIM.SingleKeyOptions | undefined>;

export interface MailTransport {
  readonly kind: 'file' | 'smtp';
  send(message: OutgoingMessage): Promise<SendResult>;
  setDkimResolver(resolver: DkimResolver | undefined): void;
  close(): void;
}

export interface MailTransportOptions {
  dkim?: DkimResolver;
  /** SMTP connections kept open by this process. */
  maxConnections?: number;
  /**
   * The envelope sender (VERP return path, src/shared/bounces) of an email sent from
   * `fromDomain`; `ownDomain` when the organization has that domain (it has a DKIM key).
   */
  returnPath?: (emailId: string, fromDomain: string, ownDomain: boolean) => string;
  /** Told once per domain key that cannot sign (its mail goes out unsigned). */
  logger?: Pick<Logger, 'warn'>;
  /** Builds a message for the relay (off-loop.ts: in the delivery thread); `composeMessage` without it. */
  compose?: (mail: SendMailOptions) => Promise<Composed>;
}

const CONNECT_TIMEOUT_MS = 10_000;

function mailOptions(message: OutgoingMessage): SendMailOptions {
  // `baseBoundary` is read by nodemailer's MailComposer (mail-composer/index.js), absent from its types.
  const options: SendMailOptions & { baseBoundary: string } = {
    from: message.from,
    to: message.to,
    cc: message.cc ?? undefined,
    bcc: message.bcc ?? undefined,
    replyTo: message.replyTo ?? undefined,
    subject: message.subject,
    html: message.html,
    // CRLF line ends, MIME's canonical form for text: a short-lined ASCII text part is sent
    // 7bit (the relay gets CRLF anyway: SMTP's DATA converts bare LFs), and bare LFs in it sent
    // DKIM's body hash down nodemailer's slow path (a regex pass over the whole body, 145 us on
    // a campaign message).
    text: message.text.replace(/\r?\n/g, '\r\n'),
    messageId: `<${message.messageId}>`,
    headers: message.headers,
    // The MIME boundaries' random part, drawn from the pooled source: nodemailer would ask the
    // OS for 8 bytes for each part of every message (3 calls an email, 20 us in a profile).
    baseBoundary: randomHex(8),
    // The body is already final: never let nodemailer fetch a URL or read a file for it.
    disableFileAccess: true,
    disableUrlAccess: true,
  };
  return message.submitted ? withSubmittedParts(options, message.submitted) : options;
}

/**
 * Made once per worker process at start-up (docs/architecture.md "Processes"). `file` writes RFC
 * 5322 `.eml` files (CRLF line ends) under MAIL_OUTBOX_DIR and reports them delivered; `smtp` hands
 * them to SMTP_URL over pooled connections.
 */
export function createMailTransport(config: Config['mail'], options: MailTransportOptions = {}): MailTransport {
  let dkim = options.dkim;
  const compose = options.compose ?? composeMessage;
  const withDkim = async (message: OutgoingMessage): Promise<SendMailOptions> => {
    const mail = mailOptions(message);
    const key = dkim ? await dkim(message.fromDomain, message.organizationId) : undefined;
    if (key) mail.dkim = key;
    return mail;
  };

  if (config.transport === 'file') {
    const transporter = nodemailer.createTransport({ streamTransport: true, buffer: true, newline: 'windows' });
    let ready: Promise<unknown> | undefined;
    return {
      kind: 'file',
      async send(message) {
        ready ??= mkdir(config.outboxDir, { recursive: true });
        await ready;
        const mail = await withDkim(message);
        // The file is the final destination: it carries the Return-Path a mailbox would add.
        const returnPath = options.returnPath?.(message.id, message.fromDomain, mail.dkim !== undefined);
        if (returnPath) mail.headers = { 'Return-Path': `<${returnPath}>`, ...(mail.headers as Record<string, string> | undefined) };
        const info = await transporter.sendMail(mail);
        const file = join(config.outboxDir, `${message.id}.eml`);
        // Write then rename, so a reader never sees half a message.
        await writeFile(`${file}.tmp`, info.message as Buffer);
        await message.beforeCommit?.();
        message.onCommit?.();
        await rename(`${file}.tmp`, file);
        message.onAccepted?.();
        return { delivered: true, response: `written to ${file}` };
      },
      setDkimResolver(resolver) {
        dkim = resolver;
      },
      close() {
        transporter.close();
      },
    };
  }

  if (!config.smtpUrl) throw new Error('SMTP_URL is required when MAIL_TRANSPORT=smtp');
  // nodemailer's pool transport itself (what `createTransport({ pool: true })` wraps in its
  // Mail layer), used through the transport interface nodemailer documents for custom
  // transports: `send({ data, message })` with what it reads of a compiled MIME node. The
  // message is built once (compose.ts); Mail.sendMail would parse the built message again (a
  // second compile, Message-ID and boundaries generated anew) before sending it.
  const pool: SmtpPool = new SMTPPool({
    ...smtpConnection(config.smtpUrl),
    pool: true,
    maxConnections: options.maxConnections ?? config.maxConnections,
    maxMessages: Infinity,
    connectionTimeout: CONNECT_TIMEOUT_MS,
    greetingTimeout: 10_000,
    socketTimeout: 60_000,
  }) as unknown as SmtpPool;
  // Domain keys already reported as unable to sign: one warning per key and process, not one a message.
  const unsignable = new Set<string>();
  const warnUnsigned = (key: DkimKey) => (reason: string) => {
    const name = `${key.keySelector}._domainkey.${key.domainName}`;
    if (unsignable.has(name)) return;
    unsignable.add(name);
    options.logger?.warn({ domain: key.domainName, selector: key.keySelector, reason }, 'DKIM key cannot sign: mail from this domain goes out unsigned');
  };
  return {
    kind: 'smtp',
    async send(message) {
      const { dkim: key, ...mail } = await withDkim(message);
      // Built in the delivery thread when there is one (a message submitted over SMTP, with
      // its attachments, is built here: rare, and its bytes would cross twice).
      const composed = message.submitted ? await composeMessage(mail) : await compose(mail);
      // DKIM-signed with nodemailer's canonicalization, the RSA signature in libuv's thread
      // pool (dkim-sign.ts).
      let raw = composed.raw;
      if (key) raw = await dkimSign(raw, key as DkimKey, warnUnsigned(key as DkimKey));
      const returnPath = options.returnPath?.(message.id, message.fromDomain, key !== undefined);
      const skip = message.skipRecipients && message.skipRecipients.length > 0 ? message.skipRecipients : undefined;
      const envelope = { ...(skip ? withoutSkipped(composed.envelope, skip) : composed.envelope), ...(returnPath ? { from: returnPath } : {}) };
      const hook = message.beforeCommit;
      const onCommit = message.onCommit;
      const onAccepted = message.onAccepted;
      // What the pool reads of nodemailer's compiled message node (smtp-pool/pool-resource.js):
      // the envelope, the Message-ID and the built message, DKIM-signed when there is a key. The
      // pool reads it only once the relay answered DATA with 354; its end is held until
      // `beforeCommit` resolves, so the final `.` follows it.
      const node = {
        getEnvelope: () => envelope,
        messageId: () => composed.messageId,
        getHeader: (name: string) => (name.toLowerCase() === 'message-id' ? composed.messageId : undefined),
        createReadStream: (): Readable => {
          const stream: Readable = new PassThrough().end(raw);
          return hook ? holdEnd(stream, hook, onCommit) : stream;
        },
      };
      const info = await new Promise<SentInfo>((resolve, reject) => {
        const queued = pool.send({ data: {}, message: node }, (error, sent) => {
          if (error) return reject(error);
          // In the turn that read the relay's answer: nothing runs before the record is sent.
          onAccepted?.();
          resolve(sent ?? {});
        });
        if (!queued) reject(Object.assign(new Error('the SMTP pool is closed'), { code: 'ECONNECTION' }));
      });
      return { delivered: false, response: info.response, ...(info.rejected?.length ? { refused: refusedOf(info) } : {}) };
    },
    setDkimResolver(resolver) {
      dkim = resolver;
    },
    close() {
      pool.close();
    },
  };
}

/** The envelope without the recipients to skip (compared bare and lower-cased). */
export function withoutSkipped<E extends { to: string[] }>(envelope: E, skip: readonly string[]): E {
  const skipped = new Set(skip);
  return { ...envelope, to: envelope.to.filter((address) => !skipped.has(address.trim().toLowerCase())) };
}

/**
 * What nodemailer's SMTP connection answers for a message the relay took
 * (smtp-connection/index.js): the recipients it refused, with an error each (`recipient`,
 * `response`), when it took the message for others.
 */
interface SentInfo {
  response?: string;
  rejected?: string[];
  rejectedErrors?: { recipient?: string; response?: string; message?: string }[];
}

function refusedOf(info: SentInfo): NonNullable<SendResult['refused']> {
  return (info.rejected ?? []).map((address) => {
    const error = info.rejectedErrors?.find((e) => e.recipient === address);
    return { address, reason: (error?.response ?? error?.message ?? 'refused by the relay').slice(0, 1000) };
  });
}

/**
 * nodemailer's SMTPPool as a transport: `send` takes the message node (envelope, Message-ID,
 * stream) and answers false once the pool is closed (its typings say void).
 */
interface SmtpPool {
  send(mail: { data: object; message: unknown }, callback: (error: Error | null, info?: SentInfo) => void): boolean;
  close(): void;
}

/**
 * `inner`, read lazily, whose end waits for `hook` (and becomes an error when it throws).
 * `onCommit` runs right before the end is released: the pipe to the socket writes the final
 * `.` in the same turn of the event loop.
 */
function holdEnd(inner: Readable, hook: () => Promise<void>, onCommit?: () => void): Readable {
  let started = false;
  const out: Readable = new Readable({
    read() {
      if (started) {
        inner.resume();
        return;
      }
      started = true;
      inner.on('data', (chunk: Buffer) => {
        if (!out.push(chunk)) inner.pause();
      });
      inner.once('end', () => {
        hook().then(
          () => {
            onCommit?.();
            out.push(null);
          },
          (error: unknown) => out.destroy(error as Error),
        );
      });
      inner.once('error', (error) => out.destroy(error));
    },
  });
  return out;
}

/** `smtp://user:pass@host:port` or `smtps://...` to nodemailer's connection options. */
export function smtpConnection(smtpUrl: string) {
  const url = new URL(smtpUrl);
  const secure = url.protocol === 'smtps:';
  const user = decodeURIComponent(url.username);
  return {
    host: url.hostname.replace(/^\[|\]$/g, ''),
    port: url.port ? Number(url.port) : secure ? 465 : 587,
    secure,
    auth: user ? { user, pass: decodeURIComponent(url.password) } : undefined,
    // Nagle's algorithm holds back the final "." of DATA until the relay ACKs the body,
    // which a delayed ACK postpones by ~40 ms: one message per 40 ms per connection. The
    // pool gets sockets with TCP_NODELAY instead (TLS, implicit or STARTTLS, runs over them).
    //
    // A socket that cannot connect is never answered as an error: nodemailer's pool then
    // fails the message but keeps the connection's slot as busy for good (pool-resource.js
    // answers a getSocket error without the 'error' event that frees it), so a relay down
    // for as many attempts as SMTP_MAX_CONNECTIONS stopped the worker sending for good. The
    // pool is told to connect by itself instead (`false`): its own attempt fails the
    // message as a connection error and frees the slot. Should that attempt succeed (a relay
    // back within a millisecond of refusing, or one that answers just after our 10 s), its
    // connection has no TCP_NODELAY: slower (a delayed ACK a message) while it lasts.
    getSocket: (options: { host?: string; port?: number }, callback: (error: Error | null, socketOptions?: { connection: Socket } | false) => void) => {
      const socket = connect(options.port ?? 587, options.host ?? 'localhost');
      socket.setNoDelay(true);
      const timer = setTimeout(() => {
        socket.destroy();
        callback(null, false);
      }, CONNECT_TIMEOUT_MS);
      socket.once('connect', () => {
        clearTimeout(timer);
        socket.removeAllListeners('error');
        callback(null, { connection: socket });
      });
      socket.once('error', () => {
        clearTimeout(timer);
        callback(null, false);
      });
    },
  };
}

export type SendFailureKind = 'permanent' | 'transient' | 'throttle';

// 4xx answers that mean "not now" (rate, load, temporary local trouble): retried later,
// never a final failure.
const THROTTLE_CODES = new Set([421, 450, 451, 452, 454]);
const THROTTLE_WORDING = /rate|throttl|too many|try again later|slow down/i;

/** How to react to a failed hand-over: 5xx fails the email, 4xx and network errors retry. */
export function classifySendError(error: unknown): { kind: SendFailureKind; reason: string } {
  const e = error as { responseCode?: number; response?: string; code?: string; message?: string };
  const reason = (e.response ?? e.message ?? String(error)).slice(0, 1000);
  const code = e.responseCode;
  // The relay refused OUR credentials or TLS: a configuration problem to fix, not a verdict on
  // this email, so it is retried with backoff (and the operator sees the warnings).
  if (e.code === 'EAUTH' || e.code === 'ETLS' || e.code === 'ENOAUTH') return { kind: 'transient', reason };
  if (typeof code === 'number') {
    if (code >= 500) return { kind: 'permanent', reason };
    if (code >= 400) return { kind: THROTTLE_CODES.has(code) || THROTTLE_WORDING.test(reason) ? 'throttle' : 'transient', reason };
  }
  // A message nodemailer refuses to build (e.g. no valid recipient) will never go through.
  if (e.code === 'EENVELOPE' || e.code === 'EMESSAGE') return { kind: 'permanent', reason };
  // Connection refused/reset, timeouts, TLS and DNS trouble: the relay may be back soon.
  return { kind: 'transient', reason };
}

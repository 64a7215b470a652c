import type { AddressInfo } from 'node:net';
import { SMTPServer, type SMTPServerDataStream, type SMTPServerOptions } from 'smtp-server';
import { callerForSecret } from '../api/plugins/auth.js';
import type { Services } from '../shared/container.js';
import { sendingPolicyRefusals } from '../shared/domains/sending-policy.js';
import { asciiAddress, isAddress } from '../shared/emails/addresses.js';
import { readSubmittedMessage } from '../shared/submission/message.js';
import { replies, SmtpReplyError } from '../shared/submission/reply.js';
import { storeSubmission } from '../shared/submission/queries.js';
import { listenOn, readTlsSettings } from '../shared/startup.js';
import { holds } from '../shared/tokens/permissions.js';
import type { Caller } from '../shared/tokens/service.js';

/** docs/smtp.md "Authentication, limits and replies": at most this many envelope recipients a message. */
export const MAX_RECIPIENTS = 50;

export interface SubmissionListener {
  /** The bound ports (SMTP_SUBMISSION_PORT=0 lets the OS choose). */
  port: number;
  tlsPort?: number;
  close(): Promise<void>;
}

export interface SubmissionOptions {
  /** How long `close` lets open sessions finish before it drops them (ms). */
  closeTimeoutMs?: number;
}

// An idle pooled client keeps its session open; shutdown waits this long at most for it.
const CLOSE_TIMEOUT_MS = 10_000;

/** What onAuth keeps in a session: the token's secret is looked up again for each message. */
interface SessionUser {
  caller: Caller;
  secret: string;
}

function asReply(error: unknown, services: Services, what: string, temporary: () => SmtpReplyError = replies.tryLater): Error {
  if (error instanceof SmtpReplyError) return error;
  services.logger.warn({ err: error }, `smtp submission: ${what} failed`);
  return temporary();
}

/** Reads DATA whole; resolves undefined when the client went away before the end. */
function readData(stream: SMTPServerDataStream): Promise<Buffer | undefined> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let settled = false;
    const finish = (value: Buffer | undefined) => {
      if (settled) return;
      settled = true;
      resolve(value);
    };
    stream.on('data', (chunk: Buffer) => {
      // Past the limit the rest is read and dropped: the reply is 552 either way.
      if (!stream.sizeExceeded) chunks.push(chunk);
    });
    stream.once('end', () => finish(Buffer.concat(chunks)));
    stream.once('error', () => finish(undefined));
    stream.once('close', () => finish(undefined));
  });
}

/**
 * The SMTP submission listener (docs/smtp.md): AUTH PLAIN or LOGIN with an
 * API token as the password (the HTTP API's lookup and per-token rate limit), then each
 * message is read, checked like `POST /api/v2/emails`, and stored with its attachments in
 * one transaction before the final `250 2.0.0 OK eml_...`.
 */
export async function startSubmission(services: Services, options: SubmissionOptions = {}): Promise<SubmissionListener> {
  const settings = services.config.smtpSubmission;
  const production = services.config.nodeEnv === 'production';
  // Learns of revocations on the token-change channel, as the API's cache does.
  const tokenCache = services.tokenCache;
  const limiter = services.tokenLimiter;
  const deps = { producer: services.producer, logger: services.logger };
  const max = settings.maxMessageBytes;
  /** The token's caller when it may send (permission `emails`); undefined when unknown, revoked or not. */
  const sender = async (secret: string): Promise<Caller | undefined> => {
    const caller = await callerForSecret(services.orm.em.fork(), tokenCache, secret);
    return caller && holds(caller.permissions, 'emails') ? caller : undefined;
  };

  let tls: { key: Buffer; cert: Buffer } | undefined;
  if (settings.certFile && settings.keyFile) {
    tls = await readTlsSettings({ file: settings.keyFile, variable: 'SMTP_TLS_KEY_FILE' }, { file: settings.certFile, variable: 'SMTP_TLS_CERT_FILE' });
  } else if (production) {
    services.logger.warn('SMTP submission has no certificate (SMTP_TLS_CERT_FILE, SMTP_TLS_KEY_FILE): AUTH is refused over plain text in production');
  }

  const serverDisabled = tls ? [] : ['STARTTLS'];
  const handlers: SMTPServerOptions = {
    banner: 'mailroom submission',
    logger: false,
    authMethods: ['PLAIN', 'LOGIN'],
    authOptional: false,
    authRequiredMessage: replies.authRequired,
    // Outside production AUTH is taken over plain text too (docs/smtp.md "Plain text"); in production it is
    // not offered before TLS (onConnect below).
    allowInsecureAuth: true,
    // The limit is enforced here (552 5.3.4), not by the library's reply without a status code.
    size: max,
    hideSize: true,
    hideDSN: true,
    hideSMTPUTF8: true,
    closeTimeout: options.closeTimeoutMs ?? CLOSE_TIMEOUT_MS,
    ...(tls ? { key: tls.key, cert: tls.cert } : {}),
    disabledCommands: serverDisabled,

    // In production AUTH is neither offered nor taken before TLS (as Postfix's
    // smtpd_tls_auth_only): EHLO does not list it, and AUTH is refused before any credential
    // is asked for, where the library's own check (allowInsecureAuth) would read the token
    // first and refuse it after. The session's list replaces the server's until TLS is up.
    onConnect(session, callback) {
      if (production && !session.secure) session.disabledCommands = [...serverDisabled, 'AUTH'];
      callback();
    },
    onSecure(_socket, session, callback) {
      session.disabledCommands = serverDisabled;
      callback();
    },

    onAuth(auth, session, callback) {
      if (!session.secure && production) return callback(replies.encryptionRequired());
      const secret = auth.password ?? '';
      sender(secret).then(
        (caller) => {
          if (!caller) return callback(replies.badCredentials());
          callback(null, { user: { caller, secret } satisfies SessionUser });
        },
        // PostgreSQL (or Redis) not answering: 454, as RFC 4954 gives a temporary AUTH failure.
        (error: unknown) => callback(asReply(error, services, 'token lookup', replies.authUnavailable)),
      );
    },

    onMailFrom(address, session, callback) {
      // AUTH is not offered here yet (production, no TLS), so the library did not ask for it.
      if (!session.user) return callback(replies.tlsFirst(tls !== undefined));
      const size = Number(address.args && typeof address.args === 'object' ? (address.args as Record<string, unknown>).SIZE : undefined);
      if (Number.isFinite(size) && size > max) return callback(replies.tooBig(max));
      const { secret } = session.user as SessionUser;
      // A session outlives its AUTH (pooled clients keep it open): the token is looked up
      // again for every message (the process's cache, as for every HTTP request), so a
      // revoked one stops sending on open sessions too.
      sender(secret)
        .then(async (caller) => {
          if (!caller) throw replies.badCredentials();
          const decision = await limiter.take(caller.tokenId);
          if (!decision.allowed) throw replies.rateLimited(decision.limit);
          // The organization's limit too, counted with its HTTP requests (RATE_LIMIT_ORG_PER_SECOND).
          const organization = await services.orgLimiter.take(caller.organizationId);
          if (!organization.allowed) throw replies.rateLimited(organization.limit, 'organization');
        })
        .then(
          () => callback(null),
          (error: unknown) => callback(asReply(error, services, 'token check')),
        );
    },

    onRcptTo(address, session, callback) {
      // The recipient as the API takes it: its domain in ASCII (smtp-server decoded an xn-- domain).
      address.address = asciiAddress(address.address);
      if (!isAddress(address.address)) return callback(replies.badRecipient());
      const known = session.envelope.rcptTo.some((r) => r.address.toLowerCase() === address.address.toLowerCase());
      if (!known && session.envelope.rcptTo.length >= MAX_RECIPIENTS) return callback(replies.tooManyRecipients(MAX_RECIPIENTS));
      callback();
    },

    onData(stream, session, callback) {
      const { secret } = session.user as SessionUser;
      const envelopeTo = session.envelope.rcptTo.map((r) => r.address);
      readData(stream)
        .then(async (raw) => {
          if (raw === undefined) throw replies.malformed('Connection closed before the end of the message');
          if (stream.sizeExceeded) throw replies.tooBig(max);
          // Looked up again at the end of DATA (the cache, no query): a token revoked while the
          // message was under way stores nothing (docs/smtp.md: refused within 2 seconds).
          const caller = await sender(secret);
          if (!caller) throw replies.badCredentials();
          const message = await readSubmittedMessage(raw, envelopeTo);
          const em = services.orm.em.fork();
          // The API's one sending policy (docs/security.md "The sending policy"; no query unless
          // ALLOW_UNVERIFIED_DOMAINS=false), for From and for who else the message says sends it
          // (Sender, Resent-From): the organization's DKIM key would sign mail "sent by" a domain
          // it does not own. Each domain once (a folded Resent-From may list thousands).
          const senders = [{ from: message.from, path: 'From' }, ...message.sentBy.map(({ header, address }) => ({ from: address, path: header }))];
          const [refused] = await sendingPolicyRefusals(em, services.config, caller.organizationId, senders, { first: true });
          if (refused) throw replies.notAllowed(`${refused.path}: ${refused.message}`);
          return storeSubmission(em, deps, caller.organizationId, message);
        })
        .then(
          (id) => {
            services.metrics.emailsAccepted.inc({ source: 'smtp' });
            callback(null, `2.0.0 OK ${id}`);
          },
          (error: unknown) => callback(asReply(error, services, 'storing a message')),
        );
    },
  };

  const servers: SMTPServer[] = [];
  const listen = async (server: SMTPServer, port: number, variable: string): Promise<number> => {
    servers.push(server);
    server.on('error', (error) => services.logger.warn({ err: error }, 'smtp submission connection error'));
    await listenOn(server, { variable: 'SMTP_SUBMISSION_HOST', value: settings.host }, { variable, value: port });
    return (server.server.address() as AddressInfo).port;
  };

  const port = await listen(new SMTPServer({ ...handlers, secure: false }), settings.port, 'SMTP_SUBMISSION_PORT');
  const tlsPort =
    tls && settings.tlsPort !== undefined ? await listen(new SMTPServer({ ...handlers, secure: true }), settings.tlsPort, 'SMTP_SUBMISSION_TLS_PORT') : undefined;
  return {
    port,
    tlsPort,
    async close() {
      await Promise.all(servers.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
    },
  };
}

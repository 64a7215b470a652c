import type { AddressInfo } from 'node:net';
import { SMTPServer, type SMTPServerAddress, type SMTPServerSession } from 'smtp-server';
import { isReturnPathHost, type ReturnPaths } from '../shared/bounces/return-path.js';
import { insertReports, newReportId, type NewReport } from '../shared/bounces/queries.js';
import type { Services } from '../shared/container.js';
import type { Logger } from '../shared/logger.js';
import { listenOn, readTlsSettings } from '../shared/startup.js';
import { replies } from '../shared/submission/reply.js';

/** One accepted message: its envelope and bytes, for each valid return-path recipient. */
export interface InboundMessage {
  mailFrom: string;
  recipients: { address: string; emailId: string }[];
  raw: Buffer;
}

export interface InboundServerOptions {
  host: string;
  /** 0: the OS chooses (tests). */
  port: number;
  maxMessageBytes: number;
  maxConnections: number;
  returnPaths: ReturnPaths;
  /** BOUNCE_DOMAIN: with `bounces.{domain}`, the only hosts a return path is taken at. */
  bounceDomain: string;
  logger: Logger;
  /**
   * Takes an accepted message; the SMTP answer waits for it, and a throw is a temporary
   * failure (451, the sender's MTA tries again later). `storeReports` in production.
   * `underWay` counts the other sessions with a message under way at the moment it is called
   * (MAIL accepted, the message not handed over yet): the messages that may join a commit.
   */
  accept: (message: InboundMessage, underWay: () => number) => Promise<void>;
  /** PEM key and certificate: STARTTLS is offered with them, not without. */
  tls?: { key: Buffer; cert: Buffer } | undefined;
  /** Called for each recipient or message the listener refuses (550, 552): the metric. */
  onRefused?: () => void;
  /** Called once the server is closed: `storeReports`'s pending work. */
  onClose?: () => Promise<void>;
}

export interface InboundServer {
  port: number;
  host: string;
  close(): Promise<void>;
}

// A DSN or ARF report has one recipient; a few more are tolerated, not hundreds.
const MAX_RECIPIENTS = 10;
const SOCKET_TIMEOUT_MS = 60_000;
// Messages written by one INSERT (group commit, `storeReports`), and the bytes of report it
// binds at most (a message over it goes alone): every report binds its whole message, and a
// statement of many 10 MB messages would pass PostgreSQL's 1 GB message limit, failing the
// honest reports grouped with them.
const MAX_BATCH = 100;
const MAX_BATCH_BYTES = 64 * 1024 * 1024;
// Stored reports gathered into one job (`storeReports`): at most this long, at most this many
// (the job payload's limit is 1,000).
const ENQUEUE_WINDOW_MS = 100;
const ENQUEUE_MAX = 500;
// How long a group commit waits for messages still under way on other sessions (`storeReports`).
// PostgreSQL's own commit_delay, taken only while commit_siblings are active, for the same
// reason: a statement saved is worth more than the wait. 1 ms and 3 ms measured alike
// (bench/README.md, 2026-11-28); a sender waits for its 250 at most this much longer.
const COMMIT_DELAY_MS = 1;

/**
 * The inbound SMTP listener (docs/outcomes.md "Bounces and complaints by mail"): accepts mail only
 * for valid return-path addresses (`b+{token}@…`, anything else is 550 at RCPT), up to
 * `maxMessageBytes` (552 beyond) and `maxConnections` at once (421 beyond), never sends anything
 * back (no bounce of a bounce). No AUTH: it is an MX, open to the world like any mailbox host.
 */
export async function startInboundServer(options: InboundServerOptions): Promise<InboundServer> {
  const { returnPaths, logger } = options;
  const refused = options.onRefused ?? (() => {});
  const tooBig = () => {
    refused();
    return replies.tooBig(options.maxMessageBytes);
  };
  // The email of each accepted recipient, from its token checked at RCPT (an HMAC: not twice).
  const emailIds = new WeakMap<SMTPServerAddress, string>();
  // Sessions whose MAIL was accepted and whose message is not handed over yet. A session that
  // starts over (RSET, EHLO) gets a new envelope without a sender and counts no more.
  const transacting = new Set<SMTPServerSession>();
  const underWay = () => {
    let count = 0;
    for (const session of transacting) if (session.envelope.mailFrom) count++;
    return count;
  };
  const server = new SMTPServer({
    banner: 'mailroom bounce and feedback receiver',
    authOptional: true,
    // STARTTLS when a certificate is configured: sending MTAs then encrypt opportunistically.
    secure: false,
    ...(options.tls ? { key: options.tls.key, cert: options.tls.cert } : {}),
    disabledCommands: options.tls ? ['AUTH'] : ['AUTH', 'STARTTLS'],
    logger: false,
    size: options.maxMessageBytes,
    // Without it smtp-server refuses a MAIL SIZE= over the limit itself, before onMailFrom, with
    // no enhanced status code (`552 Error: ...`) and no count in the metric: as the submission
    // listener does, the limit is not advertised and onMailFrom gives docs/outcomes.md's 552 5.3.4.
    hideSize: true,
    maxClients: options.maxConnections,
    socketTimeout: SOCKET_TIMEOUT_MS,
    closeTimeout: 5_000,
    onClose(session) {
      transacting.delete(session);
    },
    onMailFrom(address, session, callback) {
      // Refused early when the client declares a size over the limit (RFC 1870).
      const declared = Number((address.args || {}).SIZE ?? 0);
      if (declared > options.maxMessageBytes) return callback(tooBig());
      transacting.add(session);
      callback();
    },
    onRcptTo(address: SMTPServerAddress, session: SMTPServerSession, callback) {
      if (session.envelope.rcptTo.length >= MAX_RECIPIENTS) return callback(replies.tooManyRecipients(MAX_RECIPIENTS));
      const verified = returnPaths.verify(address.address);
      if (!verified || !isReturnPathHost(verified.host, options.bounceDomain)) {
        refused();
        return callback(replies.noSuchRecipient());
      }
      // smtp-server adds this very object to the envelope's recipients (a repeated address
      // replaces the earlier one, and went through here too): onData finds each one here.
      emailIds.set(address, verified.emailId);
      callback();
    },
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => {
        // Past the limit the rest is read and dropped; smtp-server sets sizeExceeded.
        if (!stream.sizeExceeded) chunks.push(chunk);
      });
      stream.once('error', (error) => {
        transacting.delete(session);
        callback(error);
      });
      stream.once('end', () => {
        transacting.delete(session);
        if (stream.sizeExceeded) return callback(tooBig());
        const recipients = session.envelope.rcptTo.map((r) => ({ address: r.address, emailId: emailIds.get(r)! }));
        const mailFrom = session.envelope.mailFrom ? session.envelope.mailFrom.address : '';
        options.accept({ mailFrom, recipients, raw: Buffer.concat(chunks) }, underWay).then(
          () => callback(),
          (error: unknown) => {
            logger.warn({ err: error }, 'inbound report not stored; the sender will retry');
            callback(replies.tryLater());
          },
        );
      });
    },
  });
  server.on('error', (error) => logger.warn({ err: error }, 'inbound SMTP error'));
  await listenOn(server, { variable: 'INBOUND_SMTP_HOST', value: options.host }, { variable: 'INBOUND_SMTP_PORT', value: options.port });
  const address = server.server.address() as AddressInfo;
  return {
    port: address.port,
    host: address.address,
    close: async () => {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await options.onClose?.();
    },
  };
}

/**
 * Stores accepted messages, one report per recipient, then enqueues their jobs. The SMTP
 * answer is given once the rows are committed, without waiting for Redis: a job that is not
 * added (Redis down or lost, or the process gone before it) is added by the reconciler
 * (workers/inbound.ts) a minute later.
 *
 * Writes: one statement in flight at a time, taking every message waiting (up to MAX_BATCH
 * and MAX_BATCH_BYTES: one INSERT, one commit); a message that arrives meanwhile waits for it and goes with the
 * next group. The answer waits for a durable commit. Before taking a group, the writer waits
 * up to COMMIT_DELAY_MS while other sessions still have a message under way, so that theirs
 * join the same commit; a message arriving on an otherwise idle listener is written at once.
 * Measured against four statements in flight (each message its own statement and commit), one
 * gives the same rate for a fifth less CPU a report in the listener and in PostgreSQL, and the
 * commit delay takes a fifth more off (bench/README.md): every statement is a round trip to
 * another process, and that wake-up is most of a statement's cost.
 *
 * Jobs are coalesced: the reports committed within ENQUEUE_WINDOW_MS go to one job (up to
 * ENQUEUE_MAX), so the worker reads them in one transaction with one statement a table;
 * a job per commit (a handful of reports) cost more per report than reading them. Bounce
 * processing waits that long at most; the sender does not wait for it.
 */
export function storeReports(services: Services): { accept: InboundServerOptions['accept']; close: () => Promise<void> } {
  const waiting: { reports: NewReport[]; bytes: number; done: () => void; failed: (error: unknown) => void }[] = [];
  let writing: Promise<void> | undefined;
  // The server's count of other sessions with a message under way (one server per store).
  let underWay = () => 0;
  // Wakes the writer while it waits for messages under way (COMMIT_DELAY_MS).
  let arrived: (() => void) | undefined;
  const unqueued: string[] = [];
  let timer: NodeJS.Timeout | undefined;
  const adding = new Set<Promise<unknown>>();

  const enqueue = () => {
    clearTimeout(timer);
    timer = undefined;
    while (unqueued.length > 0) {
      const reportIds = unqueued.splice(0, ENQUEUE_MAX);
      const added = services.producer
        .add('inbound', { name: 'process', data: { reportIds }, jobId: reportIds[0]! })
        .catch((error: unknown) => services.logger.warn({ err: error, reports: reportIds.length }, 'inbound reports stored but not enqueued; the reconciler will'));
      adding.add(added);
      void added.finally(() => adding.delete(added));
    }
  };

  /** Waits until a message arrives or `deadline` (performance.now()) passes. */
  const nextArrival = (deadline: number) =>
    new Promise<void>((resolve) => {
      const timeout = setTimeout(resolve, Math.max(0, deadline - performance.now()));
      arrived = () => {
        clearTimeout(timeout);
        resolve();
      };
    }).finally(() => (arrived = undefined));

  const writeBatches = async () => {
    try {
      while (waiting.length > 0) {
        const deadline = performance.now() + COMMIT_DELAY_MS;
        while (underWay() > 0 && waiting.length < MAX_BATCH && performance.now() < deadline) await nextArrival(deadline);
        let taken = 0;
        let bytes = 0;
        while (taken < Math.min(waiting.length, MAX_BATCH) && (taken === 0 || bytes + waiting[taken]!.bytes <= MAX_BATCH_BYTES)) bytes += waiting[taken++]!.bytes;
        const batch = waiting.splice(0, taken);
        const reports = batch.flatMap((b) => b.reports);
        try {
          await insertReports(services.orm.em, reports, services.clock());
        } catch (error) {
          for (const b of batch) b.failed(error);
          continue;
        }
        // Committed: the sender may drop its copy now.
        for (const b of batch) b.done();
        for (const r of reports) unqueued.push(r.id);
        if (unqueued.length >= ENQUEUE_MAX) enqueue();
        else timer ??= setTimeout(enqueue, ENQUEUE_WINDOW_MS);
      }
    } finally {
      // In the same turn as the last look at `waiting` (after the first await, so after
      // `writing` was set): the next message starts a write of its own.
      writing = undefined;
    }
  };

  return {
    accept: (message, sessionsUnderWay) =>
      new Promise<void>((resolve, reject) => {
        underWay = sessionsUnderWay;
        // One report an email: the same return path under several hosts is one report (the first).
        const recipients = message.recipients.filter((r, i) => message.recipients.findIndex((o) => o.emailId === r.emailId) === i);
        const reports = recipients.map((r) => ({ id: newReportId(), emailId: r.emailId, mailFrom: message.mailFrom, rcptTo: r.address, raw: message.raw }));
        waiting.push({ reports, bytes: reports.length * message.raw.length, done: resolve, failed: reject });
        arrived?.();
        writing ??= writeBatches();
      }),
    /** Enqueues what is stored and not enqueued yet (graceful shutdown). */
    close: async () => {
      await writing;
      enqueue();
      await Promise.all(adding);
    },
  };
}

/** The listener of a process (`npm start`, Procfile `inbound`), configured from INBOUND_*. */
export async function startInbound(services: Services, overrides: Partial<Pick<InboundServerOptions, 'port' | 'host' | 'accept'>> = {}): Promise<InboundServer> {
  const c = services.config.inbound;
  const store = overrides.accept ? undefined : storeReports(services);
  const tls = c.tlsKeyFile && c.tlsCertFile ? await readTlsSettings({ file: c.tlsKeyFile, variable: 'INBOUND_TLS_KEY' }, { file: c.tlsCertFile, variable: 'INBOUND_TLS_CERT' }) : undefined;
  return startInboundServer({
    host: c.host,
    port: c.port,
    maxMessageBytes: c.maxMessageBytes,
    maxConnections: c.maxConnections,
    returnPaths: services.returnPaths,
    bounceDomain: c.bounceDomain,
    logger: services.logger,
    accept: store ? store.accept : overrides.accept!,
    tls,
    onRefused: () => services.metrics.inboundReports.inc({ outcome: 'refused' }),
    ...(store ? { onClose: store.close } : {}),
    ...overrides,
  });
}

import type { AddressInfo } from 'node:net';
import { SMTPServer, type SMTPServerAddress, type SMTPServerSession } from 'smtp-server';
import type { ReturnPaths } from '../shared/bounces/return-path.js';
import { insertReports, newReportId, type NewReport } from '../shared/bounces/store.js';
import type { Services } from '../shared/container.js';
import type { Logger } from '../shared/logger.js';

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
  logger: Logger;
  /**
   * Takes an accepted message; the SMTP answer waits for it, and a throw is a temporary
   * failure (451, the sender's MTA tries again later). `storeReports` in production.
   */
  accept: (message: InboundMessage) => Promise<void>;
}

export interface InboundServer {
  port: number;
  host: string;
  close(): Promise<void>;
}

// A DSN or ARF report has one recipient; a few more are tolerated, not hundreds.
const MAX_RECIPIENTS = 10;
const SOCKET_TIMEOUT_MS = 60_000;
// Messages written by one INSERT (group commit, `storeReports`).
const MAX_BATCH = 100;

class SmtpReply extends Error {
  constructor(
    readonly responseCode: number,
    message: string,
  ) {
    super(message);
  }
}

/**
 * The inbound SMTP listener (contract 18a): accepts mail only for valid return-path
 * addresses (`b+{token}@…`, anything else is 550 at RCPT), up to `maxMessageBytes` (552
 * beyond) and `maxConnections` at once (421 beyond), never sends anything back (no bounce
 * of a bounce). No AUTH: it is an MX, open to the world like any mailbox host.
 */
export async function startInboundServer(options: InboundServerOptions): Promise<InboundServer> {
  const { returnPaths, logger } = options;
  const server = new SMTPServer({
    banner: 'mailroom bounce and feedback receiver',
    authOptional: true,
    disabledCommands: ['AUTH', 'STARTTLS'],
    logger: false,
    size: options.maxMessageBytes,
    maxClients: options.maxConnections,
    socketTimeout: SOCKET_TIMEOUT_MS,
    closeTimeout: 5_000,
    onMailFrom(address, session, callback) {
      // Refused early when the client declares a size over the limit (RFC 1870).
      const declared = Number((address.args || {}).SIZE ?? 0);
      if (declared > options.maxMessageBytes) return callback(new SmtpReply(552, `5.3.4 Message too big: the limit is ${options.maxMessageBytes} bytes`));
      callback();
    },
    onRcptTo(address: SMTPServerAddress, session: SMTPServerSession, callback) {
      if (session.envelope.rcptTo.length >= MAX_RECIPIENTS) return callback(new SmtpReply(452, '4.5.3 Too many recipients'));
      if (!returnPaths.verify(address.address)) return callback(new SmtpReply(550, '5.1.1 No such recipient here'));
      callback();
    },
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => {
        // Past the limit the rest is read and dropped; smtp-server sets sizeExceeded.
        if (!stream.sizeExceeded) chunks.push(chunk);
      });
      stream.once('error', (error) => callback(error));
      stream.once('end', () => {
        if (stream.sizeExceeded) return callback(new SmtpReply(552, `5.3.4 Message too big: the limit is ${options.maxMessageBytes} bytes`));
        const recipients = session.envelope.rcptTo.map((r) => ({ address: r.address, emailId: returnPaths.verify(r.address)!.emailId }));
        const mailFrom = session.envelope.mailFrom ? session.envelope.mailFrom.address : '';
        options.accept({ mailFrom, recipients, raw: Buffer.concat(chunks) }).then(
          () => callback(),
          (error: unknown) => {
            logger.warn({ err: error }, 'inbound report not stored; the sender will retry');
            callback(new SmtpReply(451, '4.3.0 Temporary failure, please try again later'));
          },
        );
      });
    },
  });
  server.on('error', (error) => logger.warn({ err: error }, 'inbound SMTP error'));
  await new Promise<void>((resolve, reject) => {
    server.server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.server.off('error', reject);
      resolve();
    });
  });
  const address = server.server.address() as AddressInfo;
  return {
    port: address.port,
    host: address.address,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/**
 * Stores accepted messages, one report per recipient, then enqueues their jobs. The SMTP
 * answer is given once the rows are committed, without waiting for Redis: a job that is not
 * added (Redis down or lost) is added by the reconciler (workers/inbound.ts) a minute later.
 *
 * Group commit: the messages that arrive on other connections while one batch is being
 * written wait for it and are written together by the next (one INSERT, one commit, one
 * enqueue round trip). A message arriving on an idle listener is written at once: no timer.
 */
export function storeReports(services: Services): (message: InboundMessage) => Promise<void> {
  const waiting: { reports: NewReport[]; done: () => void; failed: (error: unknown) => void }[] = [];
  let writing = false;

  const writeBatch = async () => {
    writing = true;
    while (waiting.length > 0) {
      const batch = waiting.splice(0, MAX_BATCH);
      const reports = batch.flatMap((b) => b.reports);
      try {
        await insertReports(services.orm.em.fork(), reports, services.clock());
      } catch (error) {
        for (const b of batch) b.failed(error);
        continue;
      }
      // Committed: the sender may drop its copy now. One job reads the batch; it is added
      // without holding the answer (or the next batch) for Redis.
      for (const b of batch) b.done();
      services.producer
        .add('inbound', { name: 'process', data: { reportIds: reports.map((r) => r.id) }, jobId: reports[0]!.id })
        .catch((error: unknown) => services.logger.warn({ err: error, reports: reports.length }, 'inbound reports stored but not enqueued; the reconciler will'));
    }
    writing = false;
  };

  return (message) =>
    new Promise<void>((resolve, reject) => {
      const reports = message.recipients.map((r) => ({ id: newReportId(), emailId: r.emailId, mailFrom: message.mailFrom, rcptTo: r.address, raw: message.raw }));
      waiting.push({ reports, done: resolve, failed: reject });
      if (!writing) void writeBatch();
    });
}

/** The listener of a process (`npm start`, Procfile `inbound`), configured from INBOUND_*. */
export function startInbound(services: Services, overrides: Partial<Pick<InboundServerOptions, 'port' | 'host' | 'accept'>> = {}): Promise<InboundServer> {
  const c = services.config.inbound;
  return startInboundServer({
    host: c.host,
    port: c.port,
    maxMessageBytes: c.maxMessageBytes,
    maxConnections: c.maxConnections,
    returnPaths: services.returnPaths,
    logger: services.logger,
    accept: storeReports(services),
    ...overrides,
  });
}

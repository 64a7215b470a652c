import { simpleParser, type ParsedMail } from 'mailparser';
import type { AddressInfo } from 'node:net';
import { SMTPServer, type SMTPServerAddress } from 'smtp-server';

export interface SinkReply {
  code: number;
  message: string;
}

/**
 * A real SMTP server on 127.0.0.1 (port 0) that keeps every message it accepts, parsed.
 * `answer(rcpt)` may refuse a recipient with an SMTP code (4xx/5xx) before DATA.
 */
export interface SmtpSink {
  url: string;
  messages: ParsedMail[];
  /** The raw RFC 5322 bytes of each parsed message, in the same order (DKIM checks). */
  raw: Buffer[];
  /** The envelope recipients (RCPT TO) of each parsed message, in the same order. */
  envelopes: string[][];
  /** The envelope sender (MAIL FROM) of each parsed message, in the same order. */
  senders: string[];
  /** Raw count, cheaper than parsing (benchmarks). */
  accepted: number;
  answer?: (recipient: string) => SinkReply | undefined;
  /** The text of the final `250` answer to a message (a relay that gives its own id); the default otherwise. */
  queued?: () => string | undefined;
  close(): Promise<void>;
}

export async function startSmtpSink(options: { parse?: boolean; port?: number } = {}): Promise<SmtpSink> {
  const parse = options.parse ?? true;
  const sink: SmtpSink = {
    url: '',
    messages: [],
    raw: [],
    envelopes: [],
    senders: [],
    accepted: 0,
    close: async () => {},
  };
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS', 'AUTH'],
    logger: false,
    size: 20 * 1024 * 1024,
    onRcptTo(address: SMTPServerAddress, _session, callback) {
      const reply = sink.answer?.(address.address);
      if (reply) {
        const error = new Error(reply.message) as Error & { responseCode: number };
        error.responseCode = reply.code;
        return callback(error);
      }
      callback();
    },
    onData(stream, session, callback) {
      if (!parse) {
        stream.on('data', () => {});
        stream.on('end', () => {
          sink.accepted++;
          callback();
        });
        return;
      }
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      const whole = new Promise<Buffer>((resolve, reject) => {
        stream.on('end', () => resolve(Buffer.concat(chunks)));
        stream.on('error', reject);
      });
      whole.then((raw) => simpleParser(raw).then((mail) => ({ raw, mail }))).then(
        ({ raw, mail }) => {
          sink.messages.push(mail);
          sink.raw.push(raw);
          sink.envelopes.push(session.envelope.rcptTo.map((a) => a.address));
          sink.senders.push(session.envelope.mailFrom ? session.envelope.mailFrom.address : '');
          sink.accepted++;
          const text = sink.queued?.();
          if (text) callback(null, text);
          else callback();
        },
        (error: Error) => callback(error),
      );
    },
  });
  await new Promise<void>((resolve) => server.listen(options.port ?? 0, '127.0.0.1', resolve));
  const { port } = server.server.address() as AddressInfo;
  sink.url = `smtp://127.0.0.1:${port}`;
  sink.close = () => new Promise<void>((resolve) => server.close(() => resolve()));
  return sink;
}

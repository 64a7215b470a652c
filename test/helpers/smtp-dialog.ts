import { connect, type Socket } from 'node:net';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';

/**
 * A plain SMTP dialogue over a socket, for tests that need to see each reply line or to
 * misbehave (disconnect mid-DATA, send over-long lines) as no real client library would.
 */
export interface SmtpDialog {
  /** The greeting, then one reply per `send` (multi-line replies joined with \n). */
  greeting: string;
  send(line: string): Promise<string>;
  /** Writes bytes as they are, without waiting for a reply. */
  write(data: string | Buffer): void;
  /** Waits for the next reply (after `write`). */
  reply(): Promise<string>;
  /** Upgrades to TLS after a 220 answer to STARTTLS. */
  startTls(): Promise<void>;
  auth(token: string): Promise<string>;
  close(): void;
  closed: Promise<void>;
}

export async function openDialog(port: number, host = '127.0.0.1'): Promise<SmtpDialog> {
  let socket: Socket | TLSSocket = connect(port, host);
  let buffer = '';
  const waiting: Array<(reply: string) => void> = [];
  const ready: string[] = [];
  let closedResolve!: () => void;
  const closed = new Promise<void>((resolve) => (closedResolve = resolve));
  const onData = (chunk: Buffer) => {
    buffer += chunk.toString('latin1');
    for (;;) {
      // A reply ends with a line "NNN text" (a space, not a dash, after the code).
      const match = /(^|\r\n)(\d{3}) [^\r\n]*\r\n/.exec(buffer);
      if (!match) return;
      const end = match.index + match[0].length;
      const reply = buffer.slice(0, end).trim().replace(/\r\n/g, '\n');
      buffer = buffer.slice(end);
      const next = waiting.shift();
      if (next) next(reply);
      else ready.push(reply);
    }
  };
  const attach = (s: Socket | TLSSocket) => {
    s.on('data', onData);
    s.on('close', () => closedResolve());
    s.on('error', () => {});
  };
  attach(socket);
  const reply = () =>
    new Promise<string>((resolve) => {
      const early = ready.shift();
      if (early !== undefined) resolve(early);
      else waiting.push(resolve);
    });
  const greeting = await reply();
  const dialog: SmtpDialog = {
    greeting,
    send(line) {
      socket.write(`${line}\r\n`);
      return reply();
    },
    write(data) {
      socket.write(data);
    },
    reply,
    async startTls() {
      const plain = socket as Socket;
      plain.removeListener('data', onData);
      socket = tlsConnect({ socket: plain, rejectUnauthorized: false });
      attach(socket);
      await new Promise<void>((resolve, reject) => {
        (socket as TLSSocket).once('secureConnect', () => resolve());
        socket.once('error', reject);
      });
    },
    auth(token) {
      return dialog.send(`AUTH PLAIN ${Buffer.from(`\0app\0${token}`).toString('base64')}`);
    },
    close() {
      socket.destroy();
    },
    closed,
  };
  return dialog;
}

import type { AddressInfo } from 'node:net';
import { SMTPServer } from 'smtp-server';

/**
 * A real SMTP server on 127.0.0.1 (port 0) that counts the messages it accepted by
 * Message-ID, read from the raw header block (no MIME parsing: cheap enough for thousands
 * of messages in a test).
 */
export interface CountingSink {
  url: string;
  /** Message-ID (without angle brackets) -> times accepted. */
  received: Map<string, number>;
  accepted: number;
  close(): Promise<void>;
}

export async function startCountingSink(options: { replyDelayMs?: number } = {}): Promise<CountingSink> {
  const sink: CountingSink = { url: '', received: new Map(), accepted: 0, close: async () => {} };
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS', 'AUTH'],
    logger: false,
    onData(stream, _session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      stream.on('end', () => {
        const raw = Buffer.concat(chunks).toString('utf8');
        const headers = raw.slice(0, raw.indexOf('\r\n\r\n'));
        const id = /^Message-ID:\s*<([^>]+)>/im.exec(headers)?.[1] ?? '(none)';
        sink.received.set(id, (sink.received.get(id) ?? 0) + 1);
        sink.accepted++;
        // The relay has the message once it read the final `.`; its answer may take a while.
        if (options.replyDelayMs) setTimeout(callback, options.replyDelayMs);
        else callback();
      });
    },
  });
  // A client killed mid-session (the test's point) resets its connection: not an error here.
  server.on('error', () => {});
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  sink.url = `smtp://127.0.0.1:${(server.server.address() as AddressInfo).port}`;
  sink.close = () => new Promise<void>((resolve) => server.close(() => resolve()));
  return sink;
}

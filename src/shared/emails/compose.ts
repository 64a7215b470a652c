import type { SendMailOptions } from 'nodemailer';
import MailComposer from 'nodemailer/lib/mail-composer/index.js';

/** A message built for the relay: its bytes, SMTP envelope and Message-ID (with angle brackets). */
export interface Composed {
  raw: Buffer;
  envelope: { from: string | false; to: string[] };
  messageId: string;
}

/**
 * Builds the MIME message nodemailer would send for `mail` (no DKIM: the caller signs). The same
 * function runs on the worker's event loop and in a delivery thread (render-pool.ts), so both
 * give the relay the same bytes. base64 is encoded natively; quoted-printable is a JS loop over
 * every character and was the largest single cost of building a message. Built into one buffer,
 * so the socket gets a few large writes rather than one per MIME line (with TCP_NODELAY each
 * write would be a packet).
 */
export async function composeMessage(mail: SendMailOptions): Promise<Composed> {
  const node = new MailComposer({ ...mail, textEncoding: 'base64' }).compile();
  const raw = await node.build();
  return { raw, envelope: node.getEnvelope() as Composed['envelope'], messageId: node.messageId() };
}

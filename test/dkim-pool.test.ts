import { generateKeyPairSync } from 'node:crypto';
import DKIM from 'nodemailer/lib/dkim/index.js';
import { afterAll, describe, expect, it } from 'vitest';
import { createDkimSigner } from '../src/shared/emails/dkim-pool.js';

// DKIM signing in worker threads (src/shared/emails/dkim-pool.ts) gives the bytes nodemailer
// gives when it signs on the event loop.
const privateKey = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
const key = { domainName: 'acme.test', keySelector: 'mr', privateKey };
const signer = createDkimSigner(2);
afterAll(() => signer.close());

async function inline(raw: Buffer): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of new DKIM(key).sign(raw)) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

describe('DKIM signing threads', () => {
  it('signs many messages at once, each exactly as nodemailer does inline', async () => {
    const raws = Array.from({ length: 40 }, (_, i) =>
      Buffer.from(`From: a@acme.test\r\nTo: user${i}@example.com\r\nSubject: Hi ${i}\r\nMessage-ID: <m${i}@acme.test>\r\n\r\nHello ${'x'.repeat(i * 100)}\r\n`),
    );
    const signed = await Promise.all(raws.map((raw) => signer.sign(raw, key)));
    for (let i = 0; i < raws.length; i++) {
      expect(signed[i]!.toString()).toMatch(/^DKIM-Signature: v=1; a=rsa-sha256;/);
      expect(signed[i]!.equals(await inline(raws[i]!))).toBe(true);
    }
  });

  it('treats a key that cannot sign as nodemailer does, and keeps signing the others', async () => {
    const raw = Buffer.from('From: a@acme.test\r\nSubject: Hi\r\n\r\nHello\r\n');
    const bad = { ...key, privateKey: 'not a key' };
    const chunks: Buffer[] = [];
    for await (const chunk of new DKIM(bad).sign(raw)) chunks.push(chunk as Buffer);
    expect((await signer.sign(raw, bad)).equals(Buffer.concat(chunks))).toBe(true);
    expect((await signer.sign(raw, key)).equals(await inline(raw))).toBe(true);
  });
});

import { generateKeyPairSync } from 'node:crypto';
import MailComposer from 'nodemailer/lib/mail-composer/index.js';
import DKIM from 'nodemailer/lib/dkim/index.js';
import { describe, expect, it } from 'vitest';
import { dkimSign } from '../src/shared/emails/dkim-sign.js';

// The DKIM signer of the send path (src/shared/emails/dkim-sign.ts) gives, byte for byte, what
// nodemailer's own signer gives for the same message and key (RSA PKCS#1 v1.5 signatures are
// deterministic), including nodemailer's treatment of odd bodies.
const privateKey = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
const key = { domainName: 'acme.test', keySelector: 'mr', privateKey };

async function nodemailerSigned(raw: Buffer, options: DKIM.Options = key): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of new DKIM(options).sign(raw)) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

const composed = (mail: ConstructorParameters<typeof MailComposer>[0]) => new MailComposer(mail).compile().build();

describe('DKIM signing', () => {
  it('signs messages built by the send path exactly as nodemailer does', async () => {
    const raws = [
      await composed({ from: 'Acme <news@acme.test>', to: 'user@example.com', subject: 'News', text: 'Hello', html: '<p>Hello</p>', messageId: '<a@acme.test>' }),
      await composed({
        from: 'news@acme.test',
        to: ['a@example.com', 'b@example.com'],
        cc: 'c@example.com',
        subject: `A long subject ${'with many words '.repeat(12)}and ünïcode`,
        html: `<p>${'Hello  there\t, '.repeat(400)}</p>`,
        text: `line with trailing spaces   \r\n\ttabbed\r\n\r\n\r\n`,
        textEncoding: 'base64',
        headers: { 'List-Unsubscribe': '<https://acme.test/u/1>', 'List-Unsubscribe-Post': 'List-Unsubscribe=One-Click' },
        attachments: [{ filename: 'a.txt', content: 'x'.repeat(5000) }],
      }),
      await composed({ from: 'news@acme.test', to: 'user@example.com', subject: 'Plain', text: 'x'.repeat(100_000) }),
    ];
    for (const raw of raws) {
      const signed = await dkimSign(raw, key);
      expect(signed.toString()).toMatch(/^DKIM-Signature: v=1; a=rsa-sha256; c=relaxed\/relaxed; d=acme.test;/);
      expect(signed.equals(await nodemailerSigned(raw))).toBe(true);
    }
  });

  it('canonicalizes odd bodies and headers as nodemailer does', async () => {
    const bodies = [
      'Hello\r\n',
      'Hello',
      'Hello  \t world \r\n\r\n\r\n',
      'trailing blanks   ',
      'a\nbare\nline feeds\n\n',
      '  \r\n \r\n',
      '\r\n',
      'x',
      '',
      'tab\tin\tthe\tmiddle\r\nand  two  spaces\r\n \r\n',
    ];
    for (const body of bodies) {
      const raw = Buffer.from(`From: a@acme.test\r\nTo: u@example.com\r\nSubject:   Folded\r\n  subject\twith  tabs \r\nX-Other: 1\r\n\r\n${body}`);
      expect((await dkimSign(raw, key)).equals(await nodemailerSigned(raw)), JSON.stringify(body)).toBe(true);
    }
    const lfOnly = Buffer.from('From: a@acme.test\nSubject: LF only\n\nHello\n');
    expect((await dkimSign(lfOnly, key)).equals(await nodemailerSigned(lfOnly))).toBe(true);
  });

  it('signs the header fields the key options name, and skips the ones they skip', async () => {
    const raw = await composed({
      from: 'news@acme.test',
      to: 'user@example.com',
      subject: 'News',
      text: 'Hello',
      headers: { 'List-Unsubscribe': '<https://acme.test/u/1>', 'List-Unsubscribe-Post': 'List-Unsubscribe=One-Click' },
    });
    const named = { ...key, headerFieldNames: 'from:to:subject:list-unsubscribe:list-unsubscribe-post' };
    const signed = await dkimSign(raw, named);
    expect(signed.toString()).toContain('h=from:to:subject:list-unsubscribe:list-unsubscribe-post;');
    expect(signed.equals(await nodemailerSigned(raw, named))).toBe(true);
    const skipping = { ...key, skipFields: 'subject:message-id' };
    expect((await dkimSign(raw, skipping)).toString()).not.toMatch(/h=[^;]*subject/);
    expect((await dkimSign(raw, skipping)).equals(await nodemailerSigned(raw, skipping))).toBe(true);
  });

  it('hashes a body of several MiB a slice at a time to the same signature', async () => {
    // Whitespace and line ends on each side of the 1 MiB slice boundaries.
    const line = (i: number) => (i % 7 === 0 ? `line ${i} with trailing blanks  \t \r\n` : i % 5 === 0 ? `bare line feed ${i}\n` : `line  ${i}\twith\t tabs\r\n`);
    let body = '';
    for (let i = 0; body.length < 3.2 * 1024 * 1024; i++) body += line(i);
    // A run of blanks and line ends across each boundary, the body's bytes being its characters.
    for (const boundary of [1024 * 1024, 2 * 1024 * 1024]) body = `${body.slice(0, boundary - 4)}x \t \r\n\r\n \t y\n${body.slice(boundary + 10)}`;
    for (const cut of [1024 * 1024 - 1, 1024 * 1024, 1024 * 1024 + 3, 2 * 1024 * 1024 + 1, body.length]) {
      const raw = Buffer.from(`From: a@acme.test\r\nSubject: Big\r\n\r\n${body.slice(0, cut)}   \r\n\r\n`);
      expect((await dkimSign(raw, key)).equals(await nodemailerSigned(raw)), String(cut)).toBe(true);
    }
  });

  it('hashes a bare line feed at a slice boundary as CRLF, as in one piece', async () => {
    const line = 'a clean line of text, nothing to canonicalize\r\n';
    const head = 'From: a@acme.test\r\nSubject: Big\r\n\r\n';
    for (const offset of [1024 * 1024, 2 * 1024 * 1024]) {
      let body = line.repeat(Math.ceil((offset + 200) / line.length));
      // The one bare LF (after an "x") sits exactly at the slice boundary.
      body = `${body.slice(0, offset - 1)}x\n${body.slice(offset + 1)}`;
      const raw = Buffer.from(head + body);
      expect((await dkimSign(raw, key)).equals(await nodemailerSigned(raw)), String(offset)).toBe(true);
    }
  });

  it('signs an internationalized domain with its punycode form', async () => {
    const raw = await composed({ from: 'a@bücher.test', to: 'u@example.com', subject: 'Hi', text: 'Hello' });
    const options = { ...key, domainName: 'bücher.test' };
    const signed = await dkimSign(raw, options);
    expect(signed.toString()).toContain('d=xn--bcher-kva.test;');
    expect(signed.equals(await nodemailerSigned(raw, options))).toBe(true);
  });

  it('leaves the message unsigned, as nodemailer does, when the key cannot sign', async () => {
    const raw = Buffer.from('From: a@acme.test\r\nSubject: Hi\r\n\r\nHello\r\n');
    const bad = { ...key, privateKey: 'not a key' };
    expect((await dkimSign(raw, bad)).equals(await nodemailerSigned(raw, bad))).toBe(true);
    expect((await dkimSign(raw, bad)).equals(raw)).toBe(true);
  });

  it('says why a message was left unsigned: an unreadable key, a key that is not RSA', async () => {
    const raw = Buffer.from('From: a@acme.test\r\nSubject: Hi\r\n\r\nHello\r\n');
    const reasons: string[] = [];
    await dkimSign(raw, { ...key, privateKey: 'not a key' }, (reason) => reasons.push(reason));
    const ed25519 = generateKeyPairSync('ed25519').privateKey;
    expect((await dkimSign(raw, { ...key, privateKey: ed25519 }, (reason) => reasons.push(reason))).equals(raw)).toBe(true);
    expect(reasons).toEqual(['the private key cannot be read', 'the key is ed25519, not RSA']);
    await dkimSign(raw, key, (reason) => reasons.push(reason));
    expect(reasons).toHaveLength(2);
  });

  it('signs many messages at once', async () => {
    const raws = Array.from({ length: 40 }, (_, i) =>
      Buffer.from(`From: a@acme.test\r\nTo: user${i}@example.com\r\nSubject: Hi ${i}\r\nMessage-ID: <m${i}@acme.test>\r\n\r\nHello ${'x'.repeat(i * 100)}\r\n`),
    );
    const signed = await Promise.all(raws.map((raw) => dkimSign(raw, key)));
    for (let i = 0; i < raws.length; i++) expect(signed[i]!.equals(await nodemailerSigned(raws[i]!))).toBe(true);
  });
});

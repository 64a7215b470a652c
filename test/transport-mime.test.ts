import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { simpleParser } from 'mailparser';
import { afterAll, describe, expect, it } from 'vitest';
import { createMailTransport } from '../src/shared/emails/transport.js';
import { startSmtpSink } from './helpers/smtp-sink.js';

// The MIME boundaries' random part comes from the pooled random source (transport.ts
// mailOptions): every message needs its own, and the parts must still read back.
describe('built messages', () => {
  const dirs: string[] = [];
  afterAll(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));

  it('carry a boundary of their own and parse back into their HTML and text parts', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'mailroom-mime-'));
    dirs.push(dir);
    const transport = createMailTransport({ transport: 'file', outboxDir: dir } as never);
    const boundaries = new Set<string>();
    for (let i = 0; i < 50; i++) {
      const id = `eml_mime${i}`;
      await transport.send({ id, organizationId: 'org_x', from: 'a@acme.test', to: `r${i}@example.com`, subject: `S${i}`, html: `<p>Hello ${i}</p>`, text: `Hello ${i}`, messageId: `${id}@acme.test`, fromDomain: 'acme.test' });
      const raw = await readFile(join(dir, `${id}.eml`));
      const boundary = /boundary="([^"]+)"/.exec(raw.toString())?.[1];
      expect(boundary).toMatch(/^--_NmP-[0-9a-f]{16}-Part_1$/);
      boundaries.add(boundary!);
      const parsed = await simpleParser(raw);
      expect(parsed.html).toContain(`<p>Hello ${i}</p>`);
      expect(parsed.text?.trim()).toBe(`Hello ${i}`);
    }
    expect(boundaries.size).toBe(50);
    transport.close();
  });
});

// A domain key that cannot sign leaves its mail unsigned (dkim-sign.ts) and says so in the
// log, once per key and process: not silently, and not once a message.
describe('a domain key that cannot sign', () => {
  it('sends unsigned through the relay and warns once for the key', async () => {
    const sink = await startSmtpSink();
    const warnings: { fields: Record<string, unknown>; message: string }[] = [];
    const logger = { warn: (fields: Record<string, unknown>, message: string) => void warnings.push({ fields, message }) };
    const transport = createMailTransport({ transport: 'smtp', smtpUrl: sink.url, maxConnections: 1 } as never, {
      dkim: async (fromDomain) => ({ domainName: fromDomain, keySelector: 'mr', privateKey: 'not a key' }),
      logger: logger as never,
    });
    try {
      for (let i = 0; i < 3; i++) {
        const id = `eml_unsigned${i}`;
        await transport.send({ id, organizationId: 'org_x', from: 'a@acme.test', to: `r${i}@example.com`, subject: 'Hi', html: '<p>Hi</p>', text: 'Hi', messageId: `${id}@acme.test`, fromDomain: 'acme.test' });
      }
      expect(sink.raw).toHaveLength(3);
      expect(sink.raw.some((raw) => raw.toString().includes('DKIM-Signature'))).toBe(false);
      expect(warnings).toEqual([
        { fields: { domain: 'acme.test', selector: 'mr', reason: 'the private key cannot be read' }, message: 'DKIM key cannot sign: mail from this domain goes out unsigned' },
      ]);
    } finally {
      transport.close();
      await sink.close();
    }
  });
});

describe('a relay that was down', () => {
  it('takes mail again once it is back, however many connections failed meanwhile', async () => {
    // A port nothing listens on, until the relay starts there.
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const { port } = probe.address() as AddressInfo;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const transport = createMailTransport({ transport: 'smtp', smtpUrl: `smtp://127.0.0.1:${port}`, maxConnections: 2 } as never);
    const message = (i: number) => ({ id: `eml_down${i}`, organizationId: 'org_x', from: 'a@acme.test', to: 'r@example.com', subject: 'Hi', html: '<p>Hi</p>', text: 'Hi', messageId: `eml_down${i}@acme.test`, fromDomain: 'acme.test' });
    let sink: Awaited<ReturnType<typeof startSmtpSink>> | undefined;
    try {
      // More refused connections than the pool has slots.
      for (let i = 0; i < 4; i++) await expect(transport.send(message(i))).rejects.toMatchObject({ code: expect.stringMatching(/ECONNREFUSED|ESOCKET|ECONNECTION/) });
      sink = await startSmtpSink({ port });
      const sent = await Promise.race([transport.send(message(9)), new Promise((_, reject) => setTimeout(() => reject(new Error('no send within 10 s')), 10_000))]);
      expect(sent).toMatchObject({ delivered: false });
      expect(sink.accepted).toBe(1);
    } finally {
      // The pool's connection first: the sink's close waits for its clients.
      transport.close();
      await sink?.close();
    }
  });
});

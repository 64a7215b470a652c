import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { simpleParser } from 'mailparser';
import { afterAll, describe, expect, it } from 'vitest';
import { createMailTransport } from '../src/shared/emails/transport.js';

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

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { runCli } from './helpers/process.js';

let ctx: TestContext;
let organizationId: string;
let dir: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ organizationId } = await createOrg(ctx.services));
  dir = await mkdtemp(join(tmpdir(), 'mailroom-import-errors-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
  await ctx?.close();
});

async function importFile(name: string, content: string, org = organizationId) {
  const file = join(dir, name);
  await writeFile(file, content);
  return runCli(['subscribers', 'import', file, '--org', org, '--json'], ctx.env.env);
}

// The tests run at once (each starts the CLI): each counts its own organization.
const count = async (org: string) => Number((await ctx.services.orm.em.fork().execute<Array<{ n: string }>>('select count(*) as n from subscribers where organization_id = ?', [org]))[0]!.n);

describe.concurrent('subscribers import: what a person sees when a file is not right', () => {
  it('names the line of each problem, counting blank lines and multi-line cells, and warns about extra cells', async () => {
    const csv = [
      'email,name', // 1
      'one@example.com,One', // 2
      '', // 3
      'two@example.com,"Two', // 4
      'lines"', // 5
      'not-an-address,Bad', // 6
      'three@example.com,Three,surplus,more', // 7
      'four@example.com', // 8
    ].join('\n');
    const result = await importFile('lines.csv', `${csv}\n`);
    expect(result.code).toBe(0);
    const summary = JSON.parse(result.stdout);
    expect(summary).toMatchObject({ rows: 5, created: 4, skipped: 1, warnings: 1 });
    const lines = result.stderr.split('\n').filter((l) => l.startsWith('line '));
    expect(lines).toEqual([
      'line 6: invalid email address "not-an-address"',
      'line 7: 4 fields but the header names 2: the last 2 ignored',
    ]);
  });

  it('refuses a broken file with one line, no stack trace, and imports nothing', async () => {
    const other = (await createOrg(ctx.services, { name: 'Broken' })).organizationId;
    const result = await importFile('broken.csv', `email,name\nfive@example.com,Five\n"six@example.com,Six\n${'seven@example.com,Seven\n'.repeat(50)}`, other);
    expect(result.code).toBe(1);
    const stderr = result.stderr.trim().split('\n').filter((l) => !l.startsWith('importing'));
    expect(stderr).toHaveLength(1);
    // Where the quote opened (line 3), not the file's last line, which the parser names.
    expect(stderr[0]).toMatch(/^mailroom: .*broken\.csv is not a valid CSV file: Quote Not Closed: the row starting at line 3 opens a quote that is never closed; nothing was imported$/);
    expect(result.stderr).not.toMatch(/\n\s+at /);
    expect(await count(other)).toBe(0);
  });

  it('refuses a file that is not UTF-8 (a Latin-1 export) with one line, and imports nothing', async () => {
    const other = (await createOrg(ctx.services, { name: 'Latin' })).organizationId;
    const file = join(dir, 'latin1.csv');
    // "Zoë Müller" in ISO-8859-1: bytes that are not UTF-8.
    await writeFile(file, Buffer.concat([Buffer.from('email,name\nzoe@example.com,'), Buffer.from([0x5a, 0x6f, 0xeb, 0x20, 0x4d, 0xfc, 0x6c, 0x6c, 0x65, 0x72]), Buffer.from('\n')]));
    const result = await runCli(['subscribers', 'import', file, '--org', other, '--json'], ctx.env.env);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/latin1\.csv is not UTF-8 \(near line 2\).*nothing was imported/);
    expect(await count(other)).toBe(0);
  });

  it('names the right line when a character straddles two read chunks, and refuses UTF-16BE naming it', async () => {
    const other = (await createOrg(ctx.services, { name: 'Chunks' })).organizationId;
    const rows = ['email,name'];
    for (let i = 0; rows.join('\n').length < 60_000; i++) rows.push(`u${i}@example.com,x`);
    let text = `${rows.join('\n')}\n`;
    // The é's first byte is the first chunk's last byte (64 KiB chunks); the bad byte comes later.
    const pad = 65_535 - Buffer.byteLength(text) - 'p@example.com,'.length;
    text += `p@example.com,${'a'.repeat(pad)}é\nq@example.com,ok\n`;
    const lineOfBad = text.split('\n').length;
    const file = join(dir, 'chunks.csv');
    await writeFile(file, Buffer.concat([Buffer.from(text), Buffer.from('r@example.com,'), Buffer.from([0xff]), Buffer.from('\n')]));
    expect(Buffer.from(text).indexOf(Buffer.from('é'))).toBe(65_535);
    const result = await runCli(['subscribers', 'import', file, '--org', other, '--json'], ctx.env.env);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(`is not UTF-8 (near line ${lineOfBad})`);

    const be = join(dir, 'utf16be.csv');
    await writeFile(be, Buffer.concat([Buffer.from([0xfe, 0xff]), Buffer.from('\u0000e\u0000m\u0000a\u0000i\u0000l', 'latin1')]));
    const refused = await runCli(['subscribers', 'import', be, '--org', other, '--json'], ctx.env.env);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/utf16be\.csv is UTF-16 big-endian: save it as UTF-8/);
    expect(await count(other)).toBe(0);
  });
});

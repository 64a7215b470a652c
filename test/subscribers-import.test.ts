import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitForRedis } from '../src/shared/redis.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { runCli } from './helpers/process.js';

let ctx: TestContext;
let org: { token: string; organizationId: string };
let dir: string;

beforeAll(async () => {
  ctx = await createTestContext();
  // The producer connection fails fast until it is ready (no offline queue): wait for it.
  await waitForRedis(ctx.services.redis);
  org = await createOrg(ctx.services, { doubleOptIn: true });
  dir = await mkdtemp(join(tmpdir(), 'mailroom-import-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
  await ctx?.close();
});

/** The CLI in one node process, as `npm run cli` runs it. */
const cli = (args: string[]) => runCli(args, ctx.env.env);

function get(ref: string) {
  return ctx.app.inject({ url: `/api/v2/subscribers/${ref}`, headers: bearer(org.token) });
}

describe('cli subscribers import (docs/audience.md "CSV import")', () => {
  it('upserts rows with tags and custom fields and prints a summary', async () => {
    // An existing contact: its tag stays, its fields merge, it is re-subscribed.
    const setup = [
      await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(org.token), payload: { email: 'old@example.com', tags: ['kept'], fields: { city: 'Lyon', plan: 'free' }, skipDoubleOptIn: true } }),
      await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers/old@example.com/unsubscribe', headers: bearer(org.token) }),
    ];
    expect(setup.map((r) => r.statusCode), setup.map((r) => r.body).join('\n')).toEqual([200, 200]);
    const file = join(dir, 'people.csv');
    await writeFile(
      file,
      [
        'Email,Name,phone,tags,plan,1bad',
        'Ann@Example.com,Ann,+33 1,vip;news,pro,x',
        'bob@example.com,,,"news|beta",,',
        'not-an-address,Nope,,,,',
        'old@example.com,Old Timer,,new,gold,',
        'ann@example.com,,,late,,',
      ].join('\n'),
    );
    const result = await cli(['subscribers', 'import', file, '--org', org.organizationId, '--json']);
    expect(result.code, result.stderr).toBe(0);
    const summary = JSON.parse(result.stdout);
    // The second Ann is merged into the first (one address, one batch): every row is counted once.
    expect(summary, result.stderr).toMatchObject({ rows: 5, created: 2, updated: 1, skipped: 1, merged: 1, warnings: 1 });
    expect(summary.created + summary.updated + summary.skipped + summary.merged).toBe(summary.rows);
    expect(result.stderr).toContain('invalid email address');

    const ann = (await get('ann@example.com')).json();
    expect(ann).toMatchObject({ name: 'Ann', phone: '+33 1', status: 'SUBSCRIBED', fields: [{ name: 'plan', value: 'pro' }] });
    expect(ann.tags.map((t: { name: string }) => t.name)).toEqual(['late', 'news', 'vip']);
    const bob = (await get('bob@example.com')).json();
    expect(bob).toMatchObject({ name: null, fields: [] });
    expect(bob.tags.map((t: { name: string }) => t.name)).toEqual(['beta', 'news']);
    const old = (await get('old@example.com')).json();
    expect(old).toMatchObject({ name: 'Old Timer', status: 'SUBSCRIBED', fields: [{ name: 'city', value: 'Lyon' }, { name: 'plan', value: 'gold' }] });
    expect(old.tags.map((t: { name: string }) => t.name)).toEqual(['kept', 'new']);
  });

  it('imports through the API with MAILROOM_TOKEN and no --org, as the token\'s organization, in requests of 1,000 records', async () => {
    const other = await createOrg(ctx.services);
    const address = await ctx.app.listen({ port: 0, host: '127.0.0.1' });
    const rows = Array.from({ length: 2_345 }, (_, i) => `api${i}@example.com,Api ${i},bulk;api-${i % 3},${i}`);
    const file = join(dir, 'through-api.csv');
    await writeFile(file, ['email,name,tags,rank', ...rows, 'not-an-address,,,', 'api7@example.com,Again,,'].join('\n'));
    const env = { ...ctx.env.env, MAILROOM_URL: address, MAILROOM_TOKEN: other.token, DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' };
    const result = await runCli(['subscribers', 'import', file, '--json'], env);
    expect(result.code, result.stderr).toBe(0);
    const summary = JSON.parse(result.stdout);
    expect(summary).toMatchObject({ organizationId: null, rows: 2_347, created: 2_345, updated: 1, skipped: 1, merged: 0 });
    expect(result.stderr).toContain('line 2347: invalid email address');
    // The repeated address came in a later request: an update, not a merge.
    expect(summary.created + summary.updated + summary.skipped + summary.merged).toBe(summary.rows);
    const seven = (await ctx.app.inject({ url: '/api/v2/subscribers/api7@example.com', headers: bearer(other.token) })).json();
    expect(seven).toMatchObject({ name: 'Again', fields: [{ name: 'rank', value: '7' }] });
    expect(seven.tags.map((t: { name: string }) => t.name)).toEqual(['api-1', 'bulk']);
    // In the token's organization only.
    expect((await get('api7@example.com')).statusCode).toBe(404);
    // A bad token is the API's answer, and nothing is imported.
    const refused = await runCli(['subscribers', 'import', file], { ...env, MAILROOM_TOKEN: `svc_${'0'.repeat(64)}` });
    expect(refused).toMatchObject({ code: 1, stderr: expect.stringContaining('missing_api_key') });
    // Neither --org nor a token: told both ways.
    const neither = await runCli(['subscribers', 'import', file], ctx.env.env);
    expect(neither).toMatchObject({ code: 2, stderr: expect.stringContaining('--org ORG_ID (the database directly) or MAILROOM_TOKEN') });
  });

  it('keeps each request through the API under its body limit when the cells are not ASCII', async () => {
    const other = await createOrg(ctx.services);
    const address = ctx.app.server.listening
      ? `http://127.0.0.1:${(ctx.app.server.address() as AddressInfo).port}`
      : await ctx.app.listen({ port: 0, host: '127.0.0.1' });
    // 300 rows of 2,500 three-byte characters: 750,000 characters, but 2.25 MB of JSON.
    const note = '€'.repeat(2_500);
    const file = join(dir, 'not-ascii.csv');
    await writeFile(file, ['email,note', ...Array.from({ length: 300 }, (_, i) => `euro${i}@example.com,${note}`)].join('\n'));
    const env = { ...ctx.env.env, MAILROOM_URL: address, MAILROOM_TOKEN: other.token, DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' };
    const result = await runCli(['subscribers', 'import', file, '--json'], env);
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ rows: 300, created: 300, skipped: 0 });
  });

  it('POST /api/v2/subscribers/import parses and imports records, reporting what it skipped', async () => {
    const answer = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/subscribers/import',
      headers: bearer(org.token),
      payload: { records: [{ email: 'rec1@example.com', tags: 'a;b', plan: 'x' }, { email: 'nope' }, { email: 'rec1@example.com', name: 'One' }], resubscribe: false },
    });
    expect(answer.statusCode, answer.body).toBe(200);
    expect(answer.json()).toEqual({ object: 'import', created: 1, updated: 0, merged: 1, skipped: [{ index: 1, error: 'invalid email address "nope"' }], warnings: [] });
    expect((await get('rec1@example.com')).json()).toMatchObject({ name: 'One', fields: [{ name: 'plan', value: 'x' }] });
    const tooMany = await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers/import', headers: bearer(org.token), payload: { records: Array.from({ length: 1_001 }, (_, i) => ({ email: `m${i}@example.com` })) } });
    expect(tooMany.statusCode).toBe(422);
    expect((await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers/import', headers: bearer(org.token), payload: { records: [] } })).statusCode).toBe(422);
    // Records are read as a CSV file is: names trimmed and lower-cased, cells trimmed; a name
    // given twice that way, or no email, skips the record and says why.
    const keyed = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/subscribers/import',
      headers: bearer(org.token),
      payload: { records: [{ ' Email ': ' Cap@Example.com ', Plan: ' gold ' }, { email: 'twice@example.com', EMAIL: 'other@example.com' }, { name: 'No Address' }] },
    });
    expect(keyed.json()).toMatchObject({
      created: 1,
      skipped: [
        { index: 1, error: 'the column "email" appears twice' },
        { index: 2, error: 'no email column' },
      ],
    });
    expect((await get('cap@example.com')).json()).toMatchObject({ fields: [{ name: 'plan', value: 'gold' }] });
    // `resubscribe`, as the CLI's --no-resubscribe: false keeps an unsubscribed contact so; the default subscribes it again.
    const importOne = (body: object) => ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers/import', headers: bearer(org.token), payload: { records: [{ email: 'cap@example.com' }], ...body } });
    expect((await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers/cap@example.com/unsubscribe', headers: bearer(org.token) })).statusCode).toBe(200);
    expect((await importOne({ resubscribe: false })).statusCode).toBe(200);
    expect((await get('cap@example.com')).json().status).toBe('UNSUBSCRIBED');
    expect((await importOne({})).statusCode).toBe(200);
    expect((await get('cap@example.com')).json().status).not.toBe('UNSUBSCRIBED');
    // The subscribers permission, as every subscriber write.
    const narrow = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(org.token), payload: { name: 'mail only', permissions: ['emails'] } });
    const refused = await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers/import', headers: bearer(narrow.json().token), payload: { records: [{ email: 'no@example.com' }] } });
    expect(refused.statusCode).toBe(403);
    expect(refused.json().name).toBe('missing_permission');
  });

  it('skips a row with more than 100 tags or 100 fields, as POST /subscribers refuses it', async () => {
    const columns = Array.from({ length: 101 }, (_, i) => `c${i}`);
    const file = join(dir, 'wide.csv');
    await writeFile(
      file,
      [
        ['email', 'tags', ...columns].join(','),
        ['many-tags@example.com', Array.from({ length: 101 }, (_, i) => `t${i}`).join(';'), ...columns.map(() => '')].join(','),
        ['many-fields@example.com', '', ...columns.map((c) => `v-${c}`)].join(','),
        ['hundred@example.com', Array.from({ length: 100 }, (_, i) => `t${i}`).join(';'), ...columns.slice(0, 100).map((c) => `v-${c}`), ''].join(','),
      ].join('\n'),
    );
    const result = await cli(['subscribers', 'import', file, '--org', org.organizationId, '--json']);
    expect(result.code, result.stderr).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ rows: 3, created: 1, skipped: 2 });
    expect(result.stderr).toContain('more than 100 tags (101)');
    expect(result.stderr).toContain('more than 100 fields (101)');
    expect((await get('many-tags@example.com')).statusCode).toBe(404);
    expect((await get('many-fields@example.com')).statusCode).toBe(404);
    const hundred = (await get('hundred@example.com')).json();
    expect(hundred.tags).toHaveLength(100);
    expect(hundred.fields).toHaveLength(100);
  });

  it('keeps unsubscribed contacts with --no-resubscribe and is idempotent', async () => {
    await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers/old@example.com/unsubscribe', headers: bearer(org.token) });
    const file = join(dir, 'again.csv');
    await writeFile(file, 'email,tags\nold@example.com,new\n');
    const result = await cli(['subscribers', 'import', file, '--org', org.organizationId, '--no-resubscribe']);
    expect(result.code, result.stderr).toBe(0);
    expect(result.stdout).toContain('0 created, 1 updated');
    expect((await get('old@example.com')).json().status).toBe('UNSUBSCRIBED');
  });

  it('fails with a message for an unknown organization or a missing file', async () => {
    const file = join(dir, 'one.csv');
    await writeFile(file, 'email\na@example.com\n');
    const noEmail = join(dir, 'no-email.csv');
    await writeFile(noEmail, 'name,phone\nAnn,1\n');
    // An empty file names no column; two email columns would lose one address of every row.
    const empty = join(dir, 'empty.csv');
    await writeFile(empty, '');
    const twice = join(dir, 'twice.csv');
    await writeFile(twice, 'email,name,Email\nfirst@example.com,Ann,second@example.com\n');
    // Each refusal is a process of its own, and none writes anything: all at once.
    const [unknown, missing, noOrg, noColumn, directory, emptied, doubled] = await Promise.all([
      cli(['subscribers', 'import', file, '--org', 'org_00000000000000000000000000']),
      cli(['subscribers', 'import', join(dir, 'nope.csv'), '--org', org.organizationId]),
      cli(['subscribers', 'import', file]),
      cli(['subscribers', 'import', noEmail, '--org', org.organizationId]),
      cli(['subscribers', 'import', dir, '--org', org.organizationId]),
      cli(['subscribers', 'import', empty, '--org', org.organizationId]),
      cli(['subscribers', 'import', twice, '--org', org.organizationId]),
    ]);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain('no organization');
    expect(missing.code).toBe(1);
    expect(noOrg.code).toBe(2);
    // A problem of the file, not of the command: one line, exit 1.
    expect(noColumn.code).toBe(1);
    expect(noColumn.stderr).toContain('no email column');
    expect(noColumn.stderr).not.toContain('Usage:');
    expect(directory.code).toBe(1);
    expect(directory.stderr).toContain('is not a file');
    expect(directory.stderr).not.toMatch(/\n\s+at /);
    expect(emptied.code).toBe(1);
    expect(emptied.stderr).toContain('is empty');
    expect(doubled.code).toBe(1);
    expect(doubled.stderr).toContain('the column "email" appears twice');
    expect(doubled.stderr).not.toMatch(/\n\s+at /);
  });
});

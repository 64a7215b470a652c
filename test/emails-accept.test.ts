import { createServer, type AddressInfo } from 'node:net';
import { initOrm } from '../src/shared/db/orm.js';
import { isDependencyDown } from '../src/shared/dependency-errors.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { acceptRequests } from '../src/shared/emails/accept.js';
import { EmailWriter, requestHash } from '../src/shared/emails/service.js';
import type { NewEmail } from '../src/shared/emails/input.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { holdIdempotencyKey, holdLock } from './helpers/database.js';

// The one write path of POST /emails: concurrent sends, with and without an
// Idempotency-Key, are written together (group commit), and each keeps its own answer.

let ctx: TestContext;
let token: string;
let organizationId: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
  const [org] = await ctx.services.orm.em.fork().execute<{ id: string }[]>('select id from organizations limit 1');
  organizationId = org!.id;
});
afterAll(async () => ctx?.close());

const base = { from: 'Acme <hello@acme.test>', to: 'jane@example.com', subject: 'Hello', html: '<p>Hi</p>' };

function send(body: unknown, headers: Record<string, string> = {}) {
  return ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: { ...bearer(token), ...headers }, payload: body as object });
}

async function rowsTo(to: string): Promise<{ id: string; subject: string; cc: string[] | null; tags: unknown; headers: unknown; status: string }[]> {
  return ctx.services.orm.em.fork().execute(`select id, subject, cc, tags, headers, status from emails where to_address = ? order by id`, [to]);
}

/** A keyed request to `to`, written and committed: its input, request hash and email ids. */
async function committedKey(to: string, key: string): Promise<{ input: NewEmail; hash: string; ids: string[] }> {
  const input: NewEmail = { organizationId, from: base.from, to, subject: 'once', contentKind: 'html', content: base.html };
  const hash = requestHash('POST /emails', { ...base, to });
  const [first] = await acceptRequests(ctx.services.orm.em.fork(), [{ emails: [input], idempotency: { key, requestHash: hash } }]);
  expect(first).toMatchObject({ ok: { replayed: false } });
  return { input, hash, ids: (first as { ok: { ids: string[] } }).ok.ids };
}

async function jobIds(): Promise<Set<string>> {
  const jobs = await ctx.services.producer.queue('emails').getJobs(['waiting', 'delayed', 'prioritized', 'active']);
  return new Set(jobs.map((j) => j.id!));
}

describe('POST /api/v2/emails: one write path, group-committed', () => {
  it('answers each of many concurrent sends, keyed or not, with its own email', async () => {
    const to = 'crowd@example.com';
    const results = await Promise.all(
      Array.from({ length: 40 }, (_, i) => send({ ...base, to, subject: `n${i}` }, i % 2 ? { 'idempotency-key': `crowd-${i}` } : {})),
    );
    expect(results.map((r) => r.statusCode)).toEqual(Array(40).fill(200));
    const ids = results.map((r) => r.json().id as string);
    expect(new Set(ids).size).toBe(40);
    const rows = await rowsTo(to);
    expect(rows).toHaveLength(40);
    // Every answer names the row holding its own body.
    const subjectOf = new Map(rows.map((r) => [r.id, r.subject]));
    ids.forEach((id, i) => expect(subjectOf.get(id)).toBe(`n${i}`));
    const jobs = await jobIds();
    for (const id of ids) expect(jobs.has(id)).toBe(true);
    const keys = await ctx.services.orm.em.fork().execute<{ idempotency_key: string; email_ids: string[] }[]>(
      `select idempotency_key, email_ids from email_idempotency_keys where idempotency_key like 'crowd-%'`,
    );
    expect(keys).toHaveLength(20);
    for (const k of keys) expect(k.email_ids).toEqual([ids[Number(k.idempotency_key.slice(6))]]);
  });

  it('keeps the values of every column through the array insert', async () => {
    const to = 'columns@example.com';
    const res = await send({
      ...base,
      to,
      subject: `quotes ' " \\ {braces}, commas and ünïcode`,
      cc: ['a@example.com', 'B <b@example.com>'],
      tags: [{ name: 'k', value: 'v' }],
      text: 'NULL',
    });
    expect(res.statusCode).toBe(200);
    const [row] = await rowsTo(to);
    expect(row).toMatchObject({ id: res.json().id, subject: `quotes ' " \\ {braces}, commas and ünïcode`, cc: ['a@example.com', 'B <b@example.com>'], tags: [{ name: 'k', value: 'v' }], headers: {}, status: 'queued' });
    const [text] = await ctx.services.orm.em.fork().execute<{ text: string | null; preview: string | null }[]>('select text, preview from emails where id = ?', [res.json().id]);
    expect(text).toEqual({ text: 'NULL', preview: null });
  });

  it('answers concurrent repeats of a key: one email, 409 to those that came while it ran, 409 for another body', async () => {
    const to = 'repeat@example.com';
    const results = await Promise.all([
      send({ ...base, to }, { 'idempotency-key': 'rep-1' }),
      send({ ...base, to }, { 'idempotency-key': 'rep-1' }),
      send({ ...base, to }, { 'idempotency-key': 'rep-1' }),
      send({ ...base, to, subject: 'another body' }, { 'idempotency-key': 'rep-1' }),
      send({ ...base, to }),
    ]);
    // Whichever keyed request is written first wins (arrival order is not the array's): it is
    // 200; a repeat in the same group, or waiting on its key, is 409; one in a later group
    // (the first committed) gets its id again; the other body is 409 whenever it did not win.
    const keyed = results.slice(0, 4);
    expect(keyed.every((r) => r.statusCode === 200 || r.statusCode === 409)).toBe(true);
    expect(keyed.filter((r) => r.statusCode === 409).length).toBeGreaterThanOrEqual(1);
    const answered = keyed.filter((r) => r.statusCode === 200);
    expect(new Set(answered.map((r) => r.json().id)).size).toBe(1);
    // The 200s are all of one body: the other body was refused.
    expect(new Set(answered.map((r) => r === results[3]))).toHaveProperty('size', 1);
    for (const r of keyed.filter((r) => r.statusCode === 409)) expect(r.json()).toMatchObject({ name: 'idempotency_conflict' });
    expect(results[4]!.statusCode).toBe(200);
    expect(await rowsTo(to)).toHaveLength(2);
  });

  it('answers repeats of a committed key in one group as the key answers: its ids, or 409 for another body', async () => {
    const to = 'committed-repeat@example.com';
    const { input, hash, ids } = await committedKey(to, 'done-1');
    const later = await acceptRequests(ctx.services.orm.em.fork(), [
      { emails: [input], idempotency: { key: 'done-1', requestHash: hash } },
      { emails: [input], idempotency: { key: 'done-1', requestHash: hash } },
      { emails: [{ ...input, subject: 'other' }], idempotency: { key: 'done-1', requestHash: 'another hash' } },
    ]);
    expect(later[0]).toEqual({ ok: { ids, replayed: true } });
    expect(later[1]).toEqual({ ok: { ids, replayed: true } });
    expect(later[2]).toMatchObject({ error: { statusCode: 409, errorName: 'idempotency_conflict' } });
    expect((later[2] as { error: Error }).error.message).toMatch(/different request body/);
    expect(await rowsTo(to)).toHaveLength(1);
  });

  it('writes the unkeyed requests of a group together again when a keyed one is held', async () => {
    const to = 'split@example.com';
    const input: NewEmail = { organizationId, from: base.from, to, subject: 'split', contentKind: 'html', content: base.html };
    const hash = requestHash('POST /emails', { ...base, to });
    const held = await holdIdempotencyKey(ctx.env.config.databaseUrl, organizationId, 'held-2', hash);
    try {
      const results = await acceptRequests(ctx.services.orm.em.fork(), [
        { emails: [input], idempotency: { key: 'held-2', requestHash: hash } },
        ...Array.from({ length: 5 }, (_, i) => ({ emails: [{ ...input, subject: `free ${i}` }] })),
      ]);
      expect(results[0]).toMatchObject({ error: { statusCode: 409 } });
      expect(results.slice(1).every((r) => 'ok' in r)).toBe(true);
      expect(await rowsTo(to)).toHaveLength(5);
    } finally {
      await held.release();
    }
  });

  it('fails only the request whose key another request holds, not the others written with it', async () => {
    const writer = new EmailWriter(ctx.services.orm, { producer: ctx.services.producer });
    const to = 'held@example.com';
    const input: NewEmail = { organizationId, from: base.from, to, subject: 'held', contentKind: 'html', content: base.html };
    const hash = requestHash('POST /emails', { ...base, to });
    const held = await holdIdempotencyKey(ctx.env.config.databaseUrl, organizationId, 'held', hash);
    try {
      const settled = await Promise.allSettled([
        writer.write(input, { key: 'held', requestHash: hash }),
        writer.write({ ...input, subject: 'free 1' }),
        writer.write({ ...input, subject: 'free 2' }, { key: 'free', requestHash: hash }),
        writer.write({ ...input, subject: 'free 3' }),
      ]);
      expect(settled[0]).toMatchObject({ status: 'rejected', reason: { statusCode: 409, errorName: 'idempotency_conflict' } });
      expect(settled.slice(1).map((s) => s.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);
      const rows = await rowsTo(to);
      expect(rows.map((r) => r.subject).sort()).toEqual(['free 1', 'free 2', 'free 3']);
    } finally {
      await held.release();
    }
    // Once the holder is gone the key is free, and a retry is written.
    const retried = await writer.write(input, { key: 'held', requestHash: hash });
    expect(retried.replayed).toBe(false);
    expect((await rowsTo(to)).map((r) => r.id)).toContain(retried.ids[0]);
  });

  it('waits, as an unkeyed send does, on any lock but its own key: a table locked for a moment is no 409', async () => {
    // Concurrent inserts wait on each other's relation-extension locks; a busy machine makes
    // such a wait last milliseconds. A keyed request is refused only for its own key.
    const to = 'waits@example.com';
    const input: NewEmail = { organizationId, from: base.from, to, subject: 'waits', contentKind: 'html', content: base.html };
    const hash = requestHash('POST /emails', { ...base, to });
    const lock = await holdLock(ctx.services.orm.em, 'lock table emails in share mode');
    const pending = acceptRequests(ctx.services.orm.em.fork(), [{ emails: [input], idempotency: { key: 'waits', requestHash: hash } }]);
    await new Promise((resolve) => setTimeout(resolve, 100));
    await lock.release();
    const [result] = await pending;
    expect(result).toMatchObject({ ok: { replayed: false } });
    expect(await rowsTo(to)).toHaveLength(1);
  });

  it('writes a group once when it fails after its insert: the read of earlier keys is in the same transaction', async () => {
    // A group of a repeated key (its earlier row must be read by a second statement), a new
    // key and an unkeyed send. Once the new key row is inserted, a trigger points the session's
    // search_path nowhere, so that second statement fails and the group is written again,
    // request by request. Had the insert committed on its own, the unkeyed email would be
    // written twice.
    const to = 'fails-after@example.com';
    const { input, hash, ids } = await committedKey(to, 'fails-after-1');
    const admin = ctx.services.orm.em.fork();
    await admin.execute(`create function lose_search_path() returns trigger language plpgsql as $$
      begin perform set_config('search_path', 'nowhere', false); return null; end $$`);
    await admin.execute(`create trigger lose_search_path after insert on email_idempotency_keys for each row
      when (new.idempotency_key = 'fails-after-2') execute function lose_search_path()`);
    // An ORM of its own: the connection whose search_path the trigger changes is closed after.
    const orm = await initOrm({ databaseUrl: ctx.env.config.databaseUrl, poolSize: 1 });
    try {
      const results = await acceptRequests(orm.em.fork(), [
        { emails: [input], idempotency: { key: 'fails-after-1', requestHash: hash } },
        { emails: [{ ...input, subject: 'new key' }], idempotency: { key: 'fails-after-2', requestHash: hash } },
        { emails: [{ ...input, subject: 'no key' }] },
      ]);
      expect(results[0]).toEqual({ ok: { ids, replayed: true } });
      expect(results[1]).toMatchObject({ ok: { replayed: false } });
      expect(results[2]).toMatchObject({ ok: { replayed: false } });
      const rows = await rowsTo(to);
      expect(rows.map((r) => r.subject).sort()).toEqual(['new key', 'no key', 'once']);
    } finally {
      await orm.close();
      await admin.execute('drop trigger lose_search_path on email_idempotency_keys');
      await admin.execute('drop function lose_search_path()');
    }
  });

  it('keeps keys per organization within one group: the same key in two organizations writes both', async () => {
    // Spec: Idempotency-Key is per organization. The group commit scopes each key by its
    // organization; scoping by the key alone would replay (or 409) the other organization's request.
    const other = await createOrg(ctx.services, { name: 'Other accept' });
    const writer = new EmailWriter(ctx.services.orm, { producer: ctx.services.producer });
    const to = 'twoorgs@example.com';
    const input: NewEmail = { organizationId, from: base.from, to, subject: 'mine', contentKind: 'html', content: base.html };
    const hash = requestHash('POST /emails', { ...base, to });
    // Both requests in ONE statement (what the writer does with requests arriving together).
    const written = await acceptRequests(ctx.services.orm.em.fork(), [
      { emails: [input], idempotency: { key: 'same-key', requestHash: hash } },
      { emails: [{ ...input, organizationId: other.organizationId, subject: 'theirs' }], idempotency: { key: 'same-key', requestHash: hash } },
    ]);
    const [mine, theirs] = written.map((r) => ('ok' in r ? r.ok : expect.fail(String(r.error))));
    expect(mine.replayed).toBe(false);
    expect(theirs.replayed).toBe(false);
    expect(mine.ids[0]).not.toBe(theirs.ids[0]);
    const rows = await rowsTo(to);
    expect(new Map(rows.map((r) => [r.id, r.subject]))).toEqual(new Map([[mine.ids[0], 'mine'], [theirs.ids[0], 'theirs']]));
    // A repeat in either organization replays that organization's own email.
    const again = await Promise.all([
      writer.write(input, { key: 'same-key', requestHash: hash }),
      writer.write({ ...input, organizationId: other.organizationId, subject: 'theirs' }, { key: 'same-key', requestHash: hash }),
    ]);
    expect(again).toEqual([
      { ids: mine.ids, replayed: true },
      { ids: theirs.ids, replayed: true },
    ]);
    expect(await rowsTo(to)).toHaveLength(2);
  });

  it('writes nothing for a batch whose key was used, and replays its ids in order', async () => {
    const to = 'batchkey@example.com';
    const payload = [
      { ...base, to, subject: 'one' },
      { ...base, to, subject: 'two' },
    ];
    const headers = { ...bearer(token), 'idempotency-key': 'batch-k' };
    const a = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers, payload });
    const b = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers, payload });
    expect(a.statusCode).toBe(200);
    expect(b.json()).toEqual(a.json());
    const rows = await rowsTo(to);
    expect(rows.map((r) => r.id)).toEqual(a.json().data.map((d: { id: string }) => d.id));
    expect(rows.map((r) => r.subject)).toEqual(['one', 'two']);
  });
});

describe('a group written while PostgreSQL is unreachable', () => {
  it('fails every request at once with the outage, not one more connection attempt per request', async () => {
    // A "PostgreSQL" that takes each connection and drops it: counted.
    let connections = 0;
    const server = createServer((socket) => {
      connections++;
      socket.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = new URL(ctx.env.config.databaseUrl);
    url.hostname = '127.0.0.1';
    url.port = String((server.address() as AddressInfo).port);
    const down = await initOrm({ databaseUrl: url.toString(), poolSize: 1 });
    try {
      const input: NewEmail = { organizationId, from: base.from, to: 'down@example.com', subject: 'down', contentKind: 'html', content: base.html };
      const requests = Array.from({ length: 5 }, () => ({ emails: [input] }));
      const results = await acceptRequests(down.em.fork(), requests);
      expect(results.every((r) => 'error' in r && isDependencyDown(r.error))).toBe(true);
      // The group's attempt (and the pool's own retries of it), not five more.
      expect(connections).toBeLessThan(requests.length);
    } finally {
      await down.close(true);
      server.close();
    }
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitForRedis } from '../src/shared/redis.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { confirmationJobsOf } from './helpers/double-opt-in.js';

let ctx: TestContext;
let token: string;
let organizationId: string;

beforeAll(async () => {
  ctx = await createTestContext();
  // The producer connection fails fast until it is ready (no offline queue): wait for it.
  await waitForRedis(ctx.services.redis);
  ({ token, organizationId } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

function api(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, body?: unknown, as = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(as), ...(body === undefined ? {} : { payload: body as object }) });
}

async function create(body: Record<string, unknown>, as = token) {
  const res = await api('POST', '/subscribers', body, as);
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

async function countRows(table: string): Promise<number> {
  const rows = (await ctx.services.orm.em.fork().execute(`select count(*)::int as n from ${table}`)) as Array<{ n: number }>;
  return rows[0].n;
}

describe('POST /api/v2/subscribers (docs/audience.md "Writes")', () => {
  it('creates a subscriber with tags created on the fly and fields', async () => {
    const body = await create({ email: '  Ada@Example.COM ', name: 'Ada', phone: '+331234', tags: ['VIP', 'news'], fields: { plan: 'pro' } });
    expect(body).toEqual({
      id: expect.stringMatching(/^sub_[0-9a-z]{26}$/),
      email: 'ada@example.com',
      name: 'Ada',
      phone: '+331234',
      status: 'SUBSCRIBED',
      tags: [
        { id: expect.stringMatching(/^tag_/), name: 'news' },
        { id: expect.stringMatching(/^tag_/), name: 'VIP' },
      ],
      fields: { plan: 'pro' },
    });
    expect(body).not.toHaveProperty('warnings');
  });

  it('upserts by address: one row, tags added, fields merged, null removes a field', async () => {
    const first = await create({ email: 'grace@example.com', tags: ['a'], fields: { x: '1', y: '2' } });
    const second = await create({ email: 'GRACE@example.com', tags: ['b', 'A'], fields: { y: null, z: '3' } });
    expect(second.id).toBe(first.id);
    expect(second.tags.map((t: { name: string }) => t.name)).toEqual(['a', 'b']);
    expect(second.fields).toEqual({ x: '1', z: '3' });
    expect(second.name).toBeNull();
  });

  it('replaceTags replaces the tags with the given ones', async () => {
    await create({ email: 'rep@example.com', tags: ['one', 'two'] });
    const body = await create({ email: 'rep@example.com', tags: ['three', 'one'], replaceTags: true });
    expect(body.tags.map((t: { name: string }) => t.name)).toEqual(['one', 'three']);
    // Without `tags` there is nothing to replace them with: an omitted property changes nothing.
    const renamed = await create({ email: 'rep@example.com', name: 'Rep', replaceTags: true });
    expect(renamed.tags.map((t: { name: string }) => t.name)).toEqual(['one', 'three']);
    const patched = await api('PATCH', '/subscribers/rep@example.com', { replaceTags: true, name: 'R' });
    expect(patched.json().tags.map((t: { name: string }) => t.name)).toEqual(['one', 'three']);
    const cleared = await create({ email: 'rep@example.com', tags: [], replaceTags: true });
    expect(cleared.tags).toEqual([]);
  });

  it('reuses a tag whatever the case of its name', async () => {
    const a = await create({ email: 'case1@example.com', tags: ['Customers'] });
    const b = await create({ email: 'case2@example.com', tags: ['customers'] });
    expect(b.tags).toEqual(a.tags);
  });

  it('applies the rest and warns about tags and fields it could not apply', async () => {
    const body = await create({
      email: 'warn@example.com',
      tags: ['ok', '', 't'.repeat(101)],
      fields: { good: 'v', '1bad': 'v', long: 'x'.repeat(10_001) },
    });
    expect(body.tags.map((t: { name: string }) => t.name)).toEqual(['ok']);
    expect(body.fields).toEqual({ good: 'v' });
    expect(body.warnings).toHaveLength(4);
    expect(body.warnings.join('\n')).toContain('1bad');
    expect(body.warnings.join('\n')).toContain('long');
  });

  it('counts tag names and field values in characters, as the tag endpoints do: an emoji is one', async () => {
    const emoji = '😀'.repeat(60);
    expect((await api('POST', '/tags', { name: emoji })).statusCode).toBe(200);
    const body = await create({ email: 'emoji@example.com', tags: [emoji, '😀'.repeat(101)], fields: { smile: '😀'.repeat(6_000), over: '😀'.repeat(10_001) } });
    expect(body.tags.map((t: { name: string }) => t.name)).toEqual([emoji]);
    expect(body.fields).toEqual({ smile: '😀'.repeat(6_000) });
    expect(body.warnings).toHaveLength(2);
  });

  it('checks an address as the verifier does: an IDN domain kept in ASCII, every atext character, no double dot', async () => {
    expect((await api('POST', '/subscribers', { email: 'Anna@Bücher.example' })).json().email).toBe('anna@xn--bcher-kva.example');
    // Found again by the address as it was given.
    expect((await api('GET', `/subscribers/${encodeURIComponent('Anna@Bücher.example')}`)).json().email).toBe('anna@xn--bcher-kva.example');
    expect((await api('POST', '/subscribers', { email: "o'brien+news!@example.com" })).statusCode).toBe(200);
    const refused = await api('POST', '/subscribers', { email: 'jane..doe@example.com' });
    expect(refused.statusCode).toBe(422);
    expect(refused.json().details).toEqual([{ path: 'email', message: 'must be a valid email address: the local part has a leading, trailing or double dot' }]);
  });

  it('stores ipAddress and country as sign-up evidence', async () => {
    const body = await create({ email: 'evidence@example.com', ipAddress: '203.0.113.7', country: 'fr' });
    const rows = (await ctx.services.orm.em.fork().execute('select signup_ip, signup_country, confirmed_at from subscribers where id = ?', [body.id])) as Array<
      Record<string, unknown>
    >;
    expect(rows[0]).toEqual({ signup_ip: '203.0.113.7', signup_country: 'FR', confirmed_at: null });
  });

  it.each([
    ['missing email', {}],
    ['invalid address', { email: 'not-an-address' }],
    ['over-long address', { email: `${'a'.repeat(250)}@example.com` }],
    ['local part over 64 characters', { email: `${'a'.repeat(65)}@example.com` }],
    ['over-long name', { email: 'bad1@example.com', name: 'n'.repeat(256) }],
    ['non-object fields', { email: 'bad2@example.com', fields: 'plan=pro' }],
    ['array fields', { email: 'bad3@example.com', fields: ['a'] }],
    ['non-string field value', { email: 'bad4@example.com', fields: { a: 1 } }],
    ['non-array tags', { email: 'bad5@example.com', tags: 'vip' }],
    ['unknown country', { email: 'bad6@example.com', country: 'XX' }],
    ['alpha-3 country', { email: 'bad7@example.com', country: 'FRA' }],
    ['invalid ip', { email: 'bad8@example.com', ipAddress: '300.1.1.1' }],
    ['non-boolean resubscribe', { email: 'bad9@example.com', resubscribe: 'yes' }],
  ])('refuses %s with 422 and writes nothing', async (_label, body) => {
    const before = [await countRows('subscribers'), await countRows('tags')];
    const res = await api('POST', '/subscribers', body);
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 422, details: expect.any(Array) });
    expect([await countRows('subscribers'), await countRows('tags')]).toEqual(before);
  });

  it('is safe under 20 concurrent creates of one address: one subscriber, the union of tags', async () => {
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => api('POST', '/subscribers', { email: 'race@example.com', tags: [`t${i}`, 'shared'] })),
    );
    expect(results.map((r) => r.statusCode)).toEqual(Array(20).fill(200));
    expect(new Set(results.map((r) => r.json().id)).size).toBe(1);
    const got = (await api('GET', '/subscribers/race@example.com')).json();
    expect(got.tags.map((t: { name: string }) => t.name).sort()).toEqual([...Array.from({ length: 20 }, (_, i) => `t${i}`), 'shared'].sort());
    const rows = (await ctx.services.orm.em.fork().execute("select count(*)::int as n from subscribers where email = 'race@example.com'")) as Array<{ n: number }>;
    expect(rows[0].n).toBe(1);
  });
});

describe('subscriber states (docs/audience.md "Status transitions")', () => {
  it('re-subscribes an UNSUBSCRIBED contact on create (resubscribe defaults to true)', async () => {
    const s = await create({ email: 'back@example.com' });
    expect((await api('POST', `/subscribers/${s.id}/unsubscribe`)).json().status).toBe('UNSUBSCRIBED');
    expect((await create({ email: 'back@example.com' })).status).toBe('SUBSCRIBED');
  });

  it('keeps an UNSUBSCRIBED contact with resubscribe: false, and on patch without resubscribe', async () => {
    const s = await create({ email: 'gone@example.com' });
    await api('POST', `/subscribers/${s.id}/unsubscribe`);
    expect((await create({ email: 'gone@example.com', resubscribe: false, name: 'G' })).status).toBe('UNSUBSCRIBED');
    expect((await api('PATCH', `/subscribers/${s.id}`, { name: 'Gone' })).json().status).toBe('UNSUBSCRIBED');
    expect((await api('PATCH', `/subscribers/${s.id}`, { resubscribe: true })).json().status).toBe('SUBSCRIBED');
  });

  it('never lifts BOUNCED, COMPLAINED or BANNED', async () => {
    const s = await create({ email: 'bounced@example.com' });
    await ctx.services.orm.em.fork().execute("update subscribers set status = 'BOUNCED' where id = ?", [s.id]);
    expect((await create({ email: 'bounced@example.com', resubscribe: true })).status).toBe('BOUNCED');
    expect((await api('POST', `/subscribers/${s.id}/unsubscribe`)).json().status).toBe('BOUNCED');
  });
});

describe('double opt-in (docs/audience.md "Double opt-in")', () => {
  let doi: { token: string; organizationId: string };
  beforeAll(async () => {
    doi = await createOrg(ctx.services, { name: 'Double', doubleOptIn: true });
  });

  it('creates PENDING_CONFIRMATION and enqueues the confirmation job', async () => {
    const s = await create({ email: 'pending@example.com' }, doi.token);
    expect(s.status).toBe('PENDING_CONFIRMATION');
    const [job, ...more] = await confirmationJobsOf(ctx, s.id);
    expect(more).toHaveLength(0);
    // Named by the confirmation record: the subscriber and the time it became pending.
    expect(job?.data).toEqual({ subscriberId: s.id, owedSince: expect.any(Number) });
    expect(job?.id).toBe(`confirm-${s.id}-${job?.data.owedSince}`);
  });

  it('skipDoubleOptIn creates SUBSCRIBED with no confirmation evidence and no job', async () => {
    const s = await create({ email: 'skip@example.com', skipDoubleOptIn: true }, doi.token);
    expect(s.status).toBe('SUBSCRIBED');
    expect(await confirmationJobsOf(ctx, s.id)).toHaveLength(0);
    const rows = (await ctx.services.orm.em.fork().execute('select confirmed_at, confirm_ip from subscribers where id = ?', [s.id])) as Array<Record<string, unknown>>;
    expect(rows[0]).toEqual({ confirmed_at: null, confirm_ip: null });
  });

  it('PATCH skipDoubleOptIn promotes PENDING_CONFIRMATION before the tag events', async () => {
    const s = await create({ email: 'promote@example.com' }, doi.token);
    const res = await api('PATCH', `/subscribers/${s.id}`, { skipDoubleOptIn: true, tags: ['welcome'], triggerWorkflows: true }, doi.token);
    expect(res.json()).toMatchObject({ status: 'SUBSCRIBED', tags: [{ name: 'welcome' }] });
    const jobs = await ctx.services.producer.queue('workflows').getJobs(['waiting', 'wait', 'delayed', 'prioritized']);
    const mine = jobs.filter((j) => j.data.subscriberId === s.id).sort((a, b) => (a.id! < b.id! ? -1 : 1));
    expect(mine.map((j) => j.name)).toEqual(['subscriber.subscribed', 'subscriber.tag_added']);
  });

  it('a pending contact stays pending on a plain upsert', async () => {
    await create({ email: 'stay@example.com' }, doi.token);
    expect((await create({ email: 'stay@example.com', name: 'S' }, doi.token)).status).toBe('PENDING_CONFIRMATION');
  });
});

describe('GET, PATCH and list (docs/audience.md)', () => {
  it('gets by id and by address in the get shape', async () => {
    const s = await create({ email: 'get@example.com', name: 'Get', tags: ['g'], fields: { b: '2', a: '1' } });
    for (const ref of [s.id, 'get@example.com', encodeURIComponent('GET@Example.com')]) {
      const res = await api('GET', `/subscribers/${ref}`);
      expect(res.statusCode).toBe(200);
      expect(res.json()).toEqual({
        id: s.id,
        email: 'get@example.com',
        name: 'Get',
        phone: null,
        status: 'SUBSCRIBED',
        createdAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
        updatedAt: expect.stringMatching(/Z$/),
        tags: [{ id: s.tags[0].id, name: 'g' }],
        fields: [
          { name: 'a', value: '1' },
          { name: 'b', value: '2' },
        ],
        revenue: 0,
      });
    }
  });

  it('answers 404 for an unknown id or address, on get and patch', async () => {
    for (const ref of ['sub_00000000000000000000000000', 'nobody@example.com', 'garbage']) {
      expect((await api('GET', `/subscribers/${ref}`)).statusCode).toBe(404);
      const res = await api('PATCH', `/subscribers/${ref}`, { name: 'x' });
      expect(res.statusCode).toBe(404);
      expect(res.json()).toMatchObject({ name: 'not_found', statusCode: 404 });
    }
  });

  it('patches the address, refusing one already taken', async () => {
    const s = await create({ email: 'old@example.com' });
    await create({ email: 'taken@example.com' });
    const taken = await api('PATCH', `/subscribers/${s.id}`, { email: 'Taken@example.com' });
    expect(taken.statusCode).toBe(422);
    expect(taken.json()).toMatchObject({ name: 'validation_error', details: [{ path: 'email' }] });
    const moved = await api('PATCH', '/subscribers/old@example.com', { email: ' New@Example.com ', phone: null });
    expect(moved.json()).toMatchObject({ id: s.id, email: 'new@example.com' });
    expect((await api('GET', '/subscribers/old@example.com')).statusCode).toBe(404);
  });

  it('refuses an invalid patch with 422 and changes nothing', async () => {
    const s = await create({ email: 'keep@example.com', name: 'Keep' });
    const res = await api('PATCH', `/subscribers/${s.id}`, { name: 'x'.repeat(300), fields: { a: 'b' } });
    expect(res.statusCode).toBe(422);
    expect((await api('GET', `/subscribers/${s.id}`)).json()).toMatchObject({ name: 'Keep', fields: [] });
  });

  it('DELETE answers 405 method_not_allowed', async () => {
    const s = await create({ email: 'nodelete@example.com' });
    const res = await api('DELETE', `/subscribers/${s.id}`);
    expect(res.statusCode).toBe(405);
    expect(res.json()).toEqual({ name: 'method_not_allowed', message: expect.any(String), statusCode: 405 });
    expect((await api('GET', `/subscribers/${s.id}`)).statusCode).toBe(200);
  });

  it('lists newest first by cursor, with status, tag and query filters', async () => {
    const org = await createOrg(ctx.services, { name: 'Lister' });
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await create({ email: `l${i}@list.test`, name: i === 2 ? 'Zed Smith' : null, tags: i % 2 ? ['odd'] : [] }, org.token)).id);
    await api('POST', `/subscribers/${ids[4]}/unsubscribe`, undefined, org.token);

    const page1 = (await api('GET', '/subscribers?limit=2', undefined, org.token)).json();
    expect(page1.object).toBe('list');
    expect(page1.has_more).toBe(true);
    expect(page1.data.map((s: { id: string }) => s.id)).toEqual([ids[4], ids[3]]);
    const page2 = (await api('GET', `/subscribers?limit=2&after=${ids[3]}`, undefined, org.token)).json();
    expect(page2.data.map((s: { id: string }) => s.id)).toEqual([ids[2], ids[1]]);
    const page3 = (await api('GET', `/subscribers?limit=2&after=${ids[1]}`, undefined, org.token)).json();
    expect(page3).toMatchObject({ has_more: false, data: [{ id: ids[0] }] });
    // `before` pages back up (docs/foundation.md "Identifiers, time and lists"): the `limit` just newer than the cursor, newest first.
    const back = (await api('GET', `/subscribers?limit=2&before=${ids[1]}`, undefined, org.token)).json();
    expect(back).toMatchObject({ has_more: true, data: [{ id: ids[3] }, { id: ids[2] }] });
    const top = (await api('GET', `/subscribers?limit=2&before=${ids[2]}`, undefined, org.token)).json();
    expect(top).toMatchObject({ has_more: false, data: [{ id: ids[4] }, { id: ids[3] }] });
    const oddBack = (await api('GET', `/subscribers?tag=odd&before=${ids[1]}`, undefined, org.token)).json();
    expect(oddBack.data.map((s: { id: string }) => s.id)).toEqual([ids[3]]);

    const unsub = (await api('GET', '/subscribers?status=UNSUBSCRIBED', undefined, org.token)).json();
    expect(unsub.data.map((s: { id: string }) => s.id)).toEqual([ids[4]]);
    const odd = (await api('GET', '/subscribers?tag=ODD', undefined, org.token)).json();
    expect(odd.data.map((s: { id: string }) => s.id)).toEqual([ids[3], ids[1]]);
    expect((await api('GET', '/subscribers?tag=none', undefined, org.token)).json().data).toEqual([]);
    const byName = (await api('GET', '/subscribers?query=smith', undefined, org.token)).json();
    expect(byName.data.map((s: { id: string }) => s.id)).toEqual([ids[2]]);
    const byEmail = (await api('GET', '/subscribers?query=L3%40', undefined, org.token)).json();
    expect(byEmail.data.map((s: { id: string }) => s.id)).toEqual([ids[3]]);
    expect((await api('GET', '/subscribers?query=%25', undefined, org.token)).json().data).toEqual([]);
  });

  it.each(['status=GONE', 'limit=0', 'limit=101', 'after=nope', 'before=nope', `after=sub_${'0'.repeat(26)}&before=sub_${'0'.repeat(26)}`])('refuses %s with 422', async (query) => {
    const res = await api('GET', `/subscribers?${query}`);
    expect(res.statusCode).toBe(422);
    expect(res.json().name).toBe('validation_error');
  });
});

describe('tags of a subscriber and unsubscribe (docs/audience.md)', () => {
  it('attaches and detaches tags, answering the create/patch shape', async () => {
    const s = await create({ email: 'tagged@example.com', tags: ['keep'] });
    const added = await api('POST', `/subscribers/${s.id}/tags`, { tags: ['new one', 'keep'] });
    expect(added.statusCode).toBe(200);
    expect(added.json().tags.map((t: { name: string }) => t.name)).toEqual(['keep', 'new one']);
    const removed = await api('DELETE', `/subscribers/tagged@example.com/tags`, { tags: ['KEEP', 'unknown'] });
    expect(removed.json()).toMatchObject({ id: s.id, tags: [{ name: 'new one' }], status: 'SUBSCRIBED', fields: {} });
    expect((await api('POST', `/subscribers/${s.id}/tags`, { tags: 'x' })).statusCode).toBe(422);
  });

  it('unsubscribe keeps tags and fields', async () => {
    const s = await create({ email: 'unsub@example.com', tags: ['t'], fields: { f: 'v' } });
    const res = await api('POST', `/subscribers/${s.id}/unsubscribe`);
    expect(res.json()).toMatchObject({ status: 'UNSUBSCRIBED', tags: [{ name: 't' }], fields: { f: 'v' } });
  });
});

describe('permissions and organizations (docs/foundation.md "Tokens and permissions")', () => {
  it('needs the subscribers permission', async () => {
    const created = await api('POST', '/tokens', { name: 'audience only', permissions: ['audience'] });
    const limited = created.json().token;
    for (const [method, url] of [
      ['POST', '/subscribers'],
      ['GET', '/subscribers'],
      ['GET', '/subscribers/a@example.com'],
      ['PATCH', '/subscribers/a@example.com'],
      ['POST', '/events'],
    ] as const) {
      const res = await api(method, url, method === 'GET' ? undefined : {}, limited);
      expect(res.statusCode).toBe(403);
      expect(res.json().name).toBe('missing_permission');
    }
  });

  it("answers 404 for another organization's subscriber", async () => {
    const s = await create({ email: 'mine@example.com' });
    const other = await createOrg(ctx.services, { name: 'Other' });
    expect((await api('GET', `/subscribers/${s.id}`, undefined, other.token)).statusCode).toBe(404);
    expect((await api('GET', '/subscribers/mine@example.com', undefined, other.token)).statusCode).toBe(404);
    expect((await api('PATCH', `/subscribers/${s.id}`, { name: 'x' }, other.token)).statusCode).toBe(404);
    expect((await api('POST', `/subscribers/${s.id}/unsubscribe`, undefined, other.token)).statusCode).toBe(404);
    expect((await api('POST', `/subscribers/${s.id}/tags`, { tags: ['x'] }, other.token)).statusCode).toBe(404);
    expect((await api('GET', `/subscribers/${s.id}/events`, undefined, other.token)).statusCode).toBe(404);
    // The same address is a separate subscriber in the other organization.
    const theirs = await create({ email: 'mine@example.com' }, other.token);
    expect(theirs.id).not.toBe(s.id);
    expect(organizationId).not.toBe(other.organizationId);
  });
});

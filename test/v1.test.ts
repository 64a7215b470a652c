import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { VERIFICATION_ZONE } from './helpers/verification-fixtures.js';

let ctx: TestContext;
let token: string;
let otherToken: string;
let dns: TestDnsServer;

beforeAll(async () => {
  dns = await startDnsServer(VERIFICATION_ZONE);
  ctx = await createTestContext({ DNS_SERVERS: dns.address });
  ({ token } = await createOrg(ctx.services));
  ({ token: otherToken } = await createOrg(ctx.services, { name: 'Other' }));
});
afterAll(async () => {
  await ctx?.close();
  await dns?.close();
});

function v2(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: object, as = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(as), ...(payload ? { payload } : {}) });
}

/** The v1 answer is the v2 answer wrapped, status code included. */
async function twin(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: object, as = token) {
  const old = await v1(method, url, payload, as);
  const current = await v2(method, url, payload, as);
  expect(old.statusCode).toBe(current.statusCode);
  if (current.statusCode < 400) expect(old.json()).toEqual({ success: true, data: current.json() });
  else expect(old.json()).toEqual({ success: false, error: current.json() });
  return current.json();
}

function v1(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: object, as = token) {
  return ctx.app.inject({ method, url: `/api/v1${url}`, headers: bearer(as), ...(payload ? { payload } : {}) });
}

describe('v1 envelope', () => {
  it('wraps 401 missing_api_key', async () => {
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v1/emails', payload: { content: 'x' } });
    expect(res.statusCode).toBe(401);
    expect(res.json()).toEqual({ success: false, error: { name: 'missing_api_key', message: expect.any(String), statusCode: 401 } });
  });

  it('wraps an unknown v1 path as 404 and leaves v2-only paths out', async () => {
    // The paths v1 names without shapes answer the same (docs/agents.md).
    for (const url of ['/nope', '/domains', '/tokens', '/tools', '/integrations/zapier', '/admin/tools']) {
      const res = await v1('GET', url);
      expect(res.statusCode).toBe(404);
      expect(res.json()).toMatchObject({ success: false, error: { name: 'not_found', statusCode: 404 } });
      // With no token too: routing comes before authentication, as on v2.
      const anonymous = await ctx.app.inject({ url: `/api/v1${url}` });
      expect(anonymous.statusCode, url).toBe(404);
      expect(anonymous.json()).toMatchObject({ success: false, error: { name: 'not_found' } });
    }
  });

  it('answers DELETE of a subscriber 405 method_not_allowed with Allow, as v2 does (deleting is disabled)', async () => {
    const res = await v1('DELETE', '/subscribers/someone@example.com');
    expect(res.statusCode).toBe(405);
    expect(res.headers.allow).toBe('GET, PATCH');
    expect(res.json()).toMatchObject({ success: false, error: { name: 'method_not_allowed', statusCode: 405 } });
  });

  it('wraps its own validation of a send as 422 with details', async () => {
    const res = await v1('POST', '/emails', { from: 'a@b.example', to: 'c@d.example', subject: 'Hi', contentType: 'PDF' });
    expect(res.statusCode).toBe(422);
    const body = res.json();
    expect(body.success).toBe(false);
    expect(body.error).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(body.error.details.map((d: { path: string }) => d.path).sort()).toEqual(['content', 'contentType']);
  });

  it('wraps invalid JSON as 400 invalid_json', async () => {
    const res = await ctx.app.inject({
      method: 'POST',
      url: '/api/v1/emails',
      headers: { ...bearer(token), 'content-type': 'application/json' },
      payload: '{nope',
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ success: false, error: { name: 'invalid_json' } });
  });

  it('refuses a bad page or limit with a wrapped 422', async () => {
    for (const query of ['page=0', 'limit=101', 'page=x']) {
      const res = await v1('GET', `/subscribers?${query}`);
      expect(res.statusCode).toBe(422);
      expect(res.json()).toMatchObject({ success: false, error: { name: 'validation_error' } });
    }
  });
});

describe('POST /api/v1/emails (send)', () => {
  const base = { from: 'Acme <hello@acme.test>', to: 'jane@example.com', subject: 'Hello' };

  it('sends markdown by default, with replyTo, and v2 lists and shows the email', async () => {
    const res = await v1('POST', '/emails', { ...base, content: '# Hi', replyTo: 'help@acme.test', tracking: { opens: false } });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toEqual({ success: true, data: { id: expect.stringMatching(/^eml_/) } });
    const id = body.data.id;
    const listed = (await v2('GET', '/emails')).json();
    expect(listed.data.map((row: { id: string }) => row.id)).toContain(id);
    const got = (await v2('GET', `/emails/${id}`)).json();
    expect(got).toMatchObject({ id, subject: 'Hello', to: ['jane@example.com'], reply_to: ['help@acme.test'], last_event: 'queued' });
    const [row] = await ctx.services.orm.em.fork().execute<{ content_kind: string; content: string }[]>(
      'select content_kind, content from emails where id = ?',
      [id],
    );
    expect(row).toMatchObject({ content_kind: 'markdown', content: '# Hi' });
  });

  it('names the v1 fields in its errors: content and replyTo, not the v2 fields they became', async () => {
    const res = await v1('POST', '/emails', { ...base, content: '', contentType: 'HTML', replyTo: 'not an address' });
    expect(res.statusCode).toBe(422);
    const { error } = res.json();
    const paths = error.details.map((d: { path: string }) => d.path);
    expect(paths).toEqual(expect.arrayContaining(['content', 'replyTo']));
    expect(paths.join(' ')).not.toMatch(/html|reply_to/);
    expect(error.message).not.toMatch(/^(html|reply_to)/);
  });

  it('refuses the v2 names of the fields it translates, naming them, rather than dropping a value', async () => {
    const res = await v1('POST', '/emails', { ...base, content: 'a', contentType: 'HTML', html: 'b', reply_to: 'x@example.com' });
    expect(res.statusCode).toBe(422);
    const paths = res.json().error.details.map((d: { path: string }) => d.path).sort();
    expect(paths).toEqual(['html', 'reply_to']);
    expect(res.json().error.message).toMatch(/v1 takes/);
  });

  it('maps contentType HTML and TIPTAP to v2 html and tiptap', async () => {
    const html = await v1('POST', '/emails', { ...base, content: '<p>Hi</p>', contentType: 'HTML' });
    expect(html.statusCode).toBe(200);
    expect((await v2('GET', `/emails/${html.json().data.id}`)).json().html).toBe('<p>Hi</p>');
    const doc = { type: 'doc', content: [{ type: 'paragraph', content: [{ type: 'text', text: 'Hi' }] }] };
    const tiptap = await v1('POST', '/emails', { ...base, content: doc, contentType: 'TIPTAP' });
    expect(tiptap.statusCode).toBe(200);
    const [row] = await ctx.services.orm.em.fork().execute<{ content_kind: string }[]>('select content_kind from emails where id = ?', [
      tiptap.json().data.id,
    ]);
    expect(row?.content_kind).toBe('tiptap');
  });

  it("wraps v2's validation errors with the same status code", async () => {
    const res = await v1('POST', '/emails', { ...base, to: ['a@example.com', 'b@example.com'], content: 'x' });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ success: false, error: { name: 'validation_error', statusCode: 422, details: [{ path: 'to' }] } });
    const attachments = await v1('POST', '/emails', { ...base, content: 'x', attachments: [] });
    expect(attachments.statusCode).toBe(422);
    expect(attachments.json().error.details[0].path).toBe('attachments');
  });

  it('passes the Idempotency-Key header on', async () => {
    const send = () =>
      ctx.app.inject({
        method: 'POST',
        url: '/api/v1/emails',
        headers: { ...bearer(token), 'idempotency-key': 'v1-key' },
        payload: { ...base, content: 'once' },
      });
    const first = await send();
    const second = await send();
    expect(second.json()).toEqual(first.json());
  });

  it("wraps the endpoint's 403 for a token without emails", async () => {
    const narrow = (await v2('POST', '/tokens', { name: 'subs only', permissions: ['subscribers'] })).json().token;
    const res = await v1('POST', '/emails', { ...base, content: 'x' }, narrow);
    expect(res.statusCode).toBe(403);
    expect(res.json()).toMatchObject({ success: false, error: { name: 'missing_permission', statusCode: 403 } });
    // Permission before v1's own validation, as v2 orders them (docs/agents.md): a bad body, a bad query.
    expect((await v1('POST', '/emails', { from: 'a@acme.test' }, narrow)).statusCode).toBe(403);
    const campaignsOnly = (await v2('POST', '/tokens', { name: 'campaigns only', permissions: ['campaigns'] })).json().token;
    expect((await v1('GET', '/subscribers?limit=0', undefined, campaignsOnly)).statusCode).toBe(403);
    expect((await v1('GET', '/subscribers?limit=0')).statusCode).toBe(422);
    // Every v1 list that validates its own query names its v2 twin's permission.
    const emailsOnly = (await v2('POST', '/tokens', { name: 'emails only', permissions: ['emails'] })).json().token;
    for (const url of ['/subscribers?limit=0', '/subscribers/anyone@example.com/events?limit=0', '/tags?limit=0', '/campaigns?limit=0']) {
      expect((await v1('GET', url, undefined, emailsOnly)).statusCode, url).toBe(403);
      expect((await v1('GET', url)).statusCode, url).toBe(422);
    }
  });
});

describe('POST /api/v1/emails/verify', () => {
  it('is POST /api/v2/verify wrapped, on the same quota', async () => {
    const old = await v1('POST', '/emails/verify', { email: 'jane@acme.io' });
    expect(old.statusCode).toBe(200);
    const current = await v2('POST', '/verify', { email: 'jane@acme.io' });
    const { id: _a, quota: oldQuota, cache_hit: _c, ...oldRest } = old.json().data;
    const { id: _b, quota, cache_hit: _d, ...rest } = current.json();
    expect(old.json().success).toBe(true);
    expect(oldRest).toEqual(rest);
    expect(quota.used).toBe(oldQuota.used + 1);
    const alias = await v1('POST', '/verify', { email: 'jane@acme.io' });
    expect(alias.json().data.quota.used).toBe(quota.used + 1);
    const missing = await v1('POST', '/emails/verify', {});
    expect(missing.statusCode).toBe(422);
    expect(missing.json()).toMatchObject({ success: false, error: { name: 'validation_error' } });
  });
});

describe('subscribers, events and tags', () => {
  it('creates through v1 what v2 reads, and reads through v1 what v2 wrote', async () => {
    const created = await v1('POST', '/subscribers', { email: 'Old@Example.com', name: 'Old', tags: ['legacy'] });
    expect(created.statusCode).toBe(200);
    expect(created.json()).toMatchObject({ success: true, data: { email: 'old@example.com', tags: [{ name: 'legacy' }] } });
    await v2('POST', '/subscribers', { email: 'new@example.com', fields: { plan: 'pro' } });
    for (const s of ['old%40example.com', 'new%40example.com', created.json().data.id]) await twin('GET', `/subscribers/${s}`);
    await twin('GET', '/subscribers/ghost%40example.com');
    await twin('GET', '/subscribers/old%40example.com', undefined, otherToken);
  });

  it('patches, tags, untags and unsubscribes like v2', async () => {
    const patched = await v1('PATCH', '/subscribers/old%40example.com', { name: 'Older' });
    expect(patched.json()).toMatchObject({ success: true, data: { name: 'Older' } });
    expect((await v2('GET', '/subscribers/old%40example.com')).json().name).toBe('Older');
    const tagged = await v1('POST', '/subscribers/old%40example.com/tags', { tags: ['gold'] });
    expect(tagged.json().data.tags.map((t: { name: string }) => t.name).sort()).toEqual(['gold', 'legacy']);
    const untagged = await v1('DELETE', '/subscribers/old%40example.com/tags', { tags: ['legacy'] });
    expect(untagged.json().data.tags.map((t: { name: string }) => t.name)).toEqual(['gold']);
    expect((await v2('GET', '/subscribers/old%40example.com')).json().tags.map((t: { name: string }) => t.name)).toEqual(['gold']);
    const bad = await twin('PATCH', '/subscribers/old%40example.com', { email: 'not-an-address' });
    expect(bad.name).toBe('validation_error');
    const unsubscribed = await v1('POST', '/subscribers/old%40example.com/unsubscribe', {});
    expect(unsubscribed.json()).toMatchObject({ success: true, data: { status: 'UNSUBSCRIBED' } });
    expect((await v2('GET', '/subscribers/old%40example.com')).json().status).toBe('UNSUBSCRIBED');
  });

  it('records events through v1 that both versions list', async () => {
    const res = await v1('POST', '/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'new@example.com', data: { amount: 1200, currency: 'EUR' } });
    expect(res.json()).toMatchObject({ success: true, data: { id: expect.any(String), eventType: 'SUBSCRIBER_PAYMENT' } });
    await v2('POST', '/events', { eventType: 'SUBSCRIBER_REFUND', subscriber: 'new@example.com', data: { amount: 200 } });
    const current = (await v2('GET', '/subscribers/new%40example.com/events')).json();
    expect(current.data).toHaveLength(2);
    const old = await v1('GET', '/subscribers/new%40example.com/events');
    expect(old.json()).toEqual({ success: true, data: current.data, pagination: { page: 1, limit: 20, hasMore: false, nextCursor: null } });
    const invalid = await twin('POST', '/events', { eventType: 'SUBSCRIBER_GIFT', subscriber: 'new@example.com', data: { amount: 1 } });
    expect(invalid.statusCode).toBe(400);
  });

  it('lists tags, creates and gets one like v2', async () => {
    const created = await v1('POST', '/tags', { name: 'beta' });
    expect(created.json()).toMatchObject({ success: true, data: { id: expect.any(String), name: 'beta' } });
    await twin('GET', '/tags/beta');
    await twin('GET', `/tags/${created.json().data.id}`);
    await twin('GET', '/tags/nope');
    const all = (await v2('GET', '/tags')).json().data;
    expect(all.length).toBeGreaterThanOrEqual(3);
    const old = await v1('GET', '/tags');
    expect(old.json()).toEqual({ success: true, data: all, pagination: { page: 1, limit: 20, hasMore: false, nextCursor: null } });
    const page2 = await v1('GET', '/tags?limit=1&page=2');
    expect(page2.json()).toMatchObject({ data: [all[1]], pagination: { page: 2, limit: 1, hasMore: true, nextCursor: all[1].id } });
    const fromCursor = await v1('GET', `/tags?limit=1&cursor=${all[0].id}`);
    expect(fromCursor.json().data).toEqual([all[1]]);
    // A cursor the list does not hold: 422 naming it, not page one again.
    const unknown = await v1('GET', '/tags?limit=1&cursor=tag_01aaaaaaaaaaaaaaaaaaaaaaaa');
    expect(unknown.statusCode).toBe(422);
    expect(unknown.json()).toMatchObject({ success: false, error: { name: 'validation_error', details: [{ path: 'cursor' }] } });
    await twin('POST', '/tags', { name: '' });
  });
});

describe('GET /api/v1/subscribers (page and cursor over v2 after)', () => {
  it('pages like walking the v2 cursors', async () => {
    for (let i = 0; i < 5; i += 1) await v2('POST', '/subscribers', { email: `page${i}@example.com` });
    const all = (await v2('GET', '/subscribers?limit=100')).json().data;
    expect(all.length).toBe(7);
    const first = (await v1('GET', '/subscribers?limit=3')).json();
    expect(first).toEqual({ success: true, data: all.slice(0, 3), pagination: { page: 1, limit: 3, hasMore: true, nextCursor: all[2].id } });
    const second = (await v1('GET', '/subscribers?limit=3&page=2')).json();
    expect(second.data).toEqual(all.slice(3, 6));
    const viaCursor = (await v1('GET', `/subscribers?limit=3&cursor=${first.pagination.nextCursor}`)).json();
    expect(viaCursor.data).toEqual(second.data);
    const third = (await v1('GET', '/subscribers?limit=3&page=3')).json();
    expect(third).toEqual({ success: true, data: all.slice(6), pagination: { page: 3, limit: 3, hasMore: false, nextCursor: null } });
    const past = (await v1('GET', '/subscribers?limit=3&page=9')).json();
    expect(past).toEqual({ success: true, data: [], pagination: { page: 9, limit: 3, hasMore: false, nextCursor: null } });
    const filtered = (await v1('GET', '/subscribers?status=UNSUBSCRIBED')).json();
    expect(filtered.data.map((s: { email: string }) => s.email)).toEqual(['old@example.com']);
    const badCursor = await v1('GET', '/subscribers?cursor=nope');
    expect(badCursor.statusCode).toBe(422);
    // Named as the caller wrote it: `cursor`, not v2's `after`.
    expect(badCursor.json()).toMatchObject({ success: false, error: { name: 'validation_error', message: expect.stringMatching(/^cursor: /), details: [{ path: 'cursor' }] } });
  });
});

describe('campaigns (list, create, get, patch, delete, send)', () => {
  let senderId: string;

  beforeAll(async () => {
    await v2('POST', '/domains', { domain: 'acme.test' });
    const sender = await v2('POST', '/senders', { name: 'Acme', email: 'news@acme.test' });
    expect(sender.statusCode).toBe(200);
    senderId = sender.json().id;
  });

  const draft = () => ({ name: 'Launch', subject: 'We launched', content: 'Hi! [Unsubscribe]({{unsubscribe_url}})', contentType: 'MARKDOWN', senderId });

  it('creates, reads, lists, patches, schedules and deletes like v2', async () => {
    const created = await v1('POST', '/campaigns', draft());
    expect(created.statusCode).toBe(200);
    expect(created.json()).toMatchObject({ success: true, data: { status: 'DRAFT', name: 'Launch' } });
    const id = created.json().data.id;
    await twin('GET', `/campaigns/${id}`);
    await v2('POST', '/campaigns', { ...draft(), name: 'Second' });
    const all = (await v2('GET', '/campaigns')).json().data;
    const listed = (await v1('GET', '/campaigns?limit=1&page=2')).json();
    expect(listed).toMatchObject({ success: true, data: [all[1]], pagination: { page: 2, limit: 1 } });

    const patched = await v1('PATCH', `/campaigns/${id}`, { subject: 'We really launched' });
    expect(patched.json()).toMatchObject({ success: true, data: { subject: 'We really launched' } });
    expect((await v2('GET', `/campaigns/${id}`)).json().subject).toBe('We really launched');
    await twin('PATCH', `/campaigns/${id}`, { name: 'x'.repeat(101) });

    const scheduledAt = new Date(Date.now() + 3_600_000).toISOString();
    const sent = await v1('POST', `/campaigns/${id}/send`, { scheduledAt });
    expect(sent.json()).toMatchObject({ success: true, data: { status: 'SCHEDULED' } });
    expect((await v2('GET', `/campaigns/${id}`)).json().status).toBe('SCHEDULED');
    const again = await twin('POST', `/campaigns/${id}/send`, {});
    expect(again.statusCode).toBe(400);

    const deleted = await v1('DELETE', `/campaigns/${id}`);
    expect(deleted.json()).toEqual({ success: true, data: { object: 'campaign', id, deleted: true } });
    await twin('GET', `/campaigns/${id}`);
  });
});

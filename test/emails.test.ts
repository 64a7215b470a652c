import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lastEvent } from '../src/shared/emails/last-event.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { holdIdempotencyKey } from './helpers/database.js';

let ctx: TestContext;
let token: string;


beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

const base = { from: 'Acme <hello@acme.test>', to: 'jane@example.com', subject: 'Hello', html: '<p>Hi</p>' };

function send(body: unknown, headers: Record<string, string> = {}, as = token) {
  return ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: { ...bearer(as), ...headers }, payload: body as object });
}

async function count(table = 'emails'): Promise<number> {
  const [row] = await ctx.services.orm.em.fork().execute<{ n: string }[]>(`select count(*) as n from ${table}`);
  return Number(row!.n);
}

async function jobCount(): Promise<number> {
  const counts = await ctx.services.producer.queue('emails').getJobCounts('waiting', 'delayed', 'active', 'prioritized');
  return Object.values(counts).reduce((a, b) => a + b, 0);
}

describe('POST /api/v2/emails (docs/emails.md "Validation")', () => {
  it('accepts a send, writes a queued row and enqueues a job whose id is the email id', async () => {
    const res = await send({ ...base, to: ['jane@example.com'], cc: 'c@example.com', reply_to: ['r@example.com'], tags: [{ name: 'kind', value: 'welcome' }] });
    expect(res.statusCode).toBe(200);
    const { id } = res.json();
    expect(res.json()).toEqual({ id: expect.stringMatching(/^eml_[0-9a-z]{26}$/) });
    const job = await ctx.services.producer.queue('emails').getJob(id);
    expect(job?.name).toBe('send');
    expect(job?.data).toEqual({ emailId: id });
    const got = (await ctx.app.inject({ url: `/api/v2/emails/${id}`, headers: bearer(token) })).json();
    expect(got).toMatchObject({
      object: 'email',
      id,
      from: 'Acme <hello@acme.test>',
      to: ['jane@example.com'],
      cc: ['c@example.com'],
      bcc: null,
      reply_to: ['r@example.com'],
      subject: 'Hello',
      html: '<p>Hi</p>',
      text: null,
      message_id: null,
      scheduled_at: null,
      tags: [{ name: 'kind', value: 'welcome' }],
      last_event: 'queued',
    });
    expect(got.created_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  });

  it('accepts markdown and tiptap, and a tiptap document given as JSON text', async () => {
    expect((await send({ ...base, html: undefined, markdown: '# Hi' })).statusCode).toBe(200);
    const doc = { type: 'doc', content: [{ type: 'paragraph', content: [{ type: 'text', text: 'Hi' }] }] };
    expect((await send({ ...base, html: undefined, tiptap: doc })).statusCode).toBe(200);
    expect((await send({ ...base, html: undefined, tiptap: JSON.stringify(doc) })).statusCode).toBe(200);
  });

  it.each([
    ['no body field', { ...base, html: undefined }, 'html'],
    ['two body fields', { ...base, markdown: '# x' }, 'markdown'],
    ['a missing from', { ...base, from: undefined }, 'from'],
    ['an unparseable from', { ...base, from: 'Acme hello@' }, 'from'],
    ['a from with CR/LF', { ...base, from: 'Acme <a@acme.test>\r\nBcc: x@evil.test' }, 'from'],
    ['a to with CR/LF', { ...base, to: 'jane@example.com\nBcc: x@evil.test' }, 'to'],
    ['two recipients', { ...base, to: ['a@example.com', 'b@example.com'] }, 'to'],
    ['an empty to array', { ...base, to: [] }, 'to'],
    ['an unparseable to', { ...base, to: 'not an address' }, 'to'],
    ['a double dot in the local part', { ...base, to: 'jane..doe@example.com' }, 'to'],
    ['a leading dot in the local part', { ...base, to: 'Jane <.jane@example.com>' }, 'to'],
    ['a trailing dot in the local part', { ...base, cc: ['jane.@example.com'] }, 'cc.0'],
    ['a local part over 64 characters', { ...base, to: `${'a'.repeat(65)}@example.com` }, 'to'],
    ['a control character in the local part', { ...base, to: 'a\u0001b@example.com' }, 'to'],
    ['a subject with CR/LF', { ...base, subject: 'Hi\r\nBcc: x@evil.test' }, 'subject'],
    ['a missing subject', { ...base, subject: undefined }, 'subject'],
    ['a subject over 998 characters', { ...base, subject: 's'.repeat(999) }, 'subject'],
    ['an unparseable cc', { ...base, cc: ['ok@example.com', 'nope'] }, 'cc.1'],
    ['51 bcc', { ...base, bcc: Array.from({ length: 51 }, (_, i) => `b${i}@example.com`) }, 'bcc'],
    ['a bad tag', { ...base, tags: [{ name: 'has space', value: 'x' }] }, 'tags.0.name'],
    ['an invalid tiptap document', { ...base, html: undefined, tiptap: { type: 'doc', content: [{ type: 'bogus' }] } }, 'tiptap'],
    ['a tiptap document that is not a doc', { ...base, html: undefined, tiptap: { type: 'paragraph' } }, 'tiptap'],
    ['tiptap text that is not JSON', { ...base, html: undefined, tiptap: '{nope' }, 'tiptap'],
    ['content (v1)', { ...base, content: 'x' }, 'content'],
    ['contentType', { ...base, contentType: 'HTML' }, 'contentType'],
    ['attachments', { ...base, attachments: [] }, 'attachments'],
    ['template', { ...base, template: 'x' }, 'template'],
    ['topic_id', { ...base, topic_id: 'x' }, 'topic_id'],
    ['scheduled_at', { ...base, scheduled_at: '2030-01-01T00:00:00Z' }, 'scheduled_at'],
    ['react', { ...base, react: 'x' }, 'react'],
    ['tracking', { ...base, tracking: false }, 'tracking'],
  ])('refuses %s with 422 naming the field, and writes nothing', async (_label, body, path) => {
    const [rows, jobs] = [await count(), await jobCount()];
    const res = await send(body);
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(res.json().details.map((d: { path: string }) => d.path)).toContain(path);
    expect([await count(), await jobCount()]).toEqual([rows, jobs]);
  });

  it('answers a malformed body 400 invalid_json, a non-JSON body 415, an oversized one 413', async () => {
    const rows = await count();
    const headers = { ...bearer(token), 'content-type': 'application/json' };
    const bad = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers, payload: '{"from":' });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().name).toBe('invalid_json');
    const text = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: { ...bearer(token), 'content-type': 'text/plain' }, payload: 'hi' });
    expect(text.statusCode).toBe(415);
    const big = await send({ ...base, html: 'x'.repeat(1024 * 1024 + 1) });
    expect(big.statusCode).toBe(413);
    expect(big.json()).toMatchObject({ name: 'payload_too_large', statusCode: 413 });
    expect(await count()).toBe(rows);
  });

  it('needs the emails permission (403 missing_permission)', async () => {
    const limited = (await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(token), payload: { name: 'subs', permissions: ['subscribers'] } })).json().token;
    const res = await send(base, {}, limited);
    expect(res.statusCode).toBe(403);
    expect(res.json().name).toBe('missing_permission');
  });
});

describe('Idempotency-Key (docs/emails.md "Idempotency-Key")', () => {
  it('answers the same id for the same key and body, and enqueues one job', async () => {
    const first = await send(base, { 'idempotency-key': 'order-1' });
    const rows = await count();
    const again = await send({ subject: 'Hello', html: '<p>Hi</p>', to: 'jane@example.com', from: 'Acme <hello@acme.test>' }, { 'idempotency-key': 'order-1' });
    expect(first.statusCode).toBe(200);
    expect(again.json()).toEqual(first.json());
    expect(await count()).toBe(rows);
  });

  it('answers 409 idempotency_conflict for the same key with another body', async () => {
    await send(base, { 'idempotency-key': 'order-2' });
    const res = await send({ ...base, subject: 'Other' }, { 'idempotency-key': 'order-2' });
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ name: 'idempotency_conflict', statusCode: 409 });
  });

  it('writes one email for requests with the same key arriving at once: 409 while it runs, its answer once committed', async () => {
    const rows = await count();
    const results = await Promise.all(Array.from({ length: 8 }, () => send(base, { 'idempotency-key': 'race-1' })));
    const ok = results.filter((r) => r.statusCode === 200);
    const running = results.filter((r) => r.statusCode === 409);
    expect(ok.length + running.length).toBe(8);
    expect(ok.length).toBeGreaterThanOrEqual(1);
    // Eight at once: some arrive while the first runs (docs/emails.md "Idempotency-Key").
    expect(running.length).toBeGreaterThanOrEqual(1);
    for (const r of running) expect(r.json()).toMatchObject({ name: 'idempotency_conflict', message: expect.stringMatching(/still being processed/) });
    expect(new Set(ok.map((r) => r.json().id)).size).toBe(1);
    expect(await count()).toBe(rows + 1);
    // Once it has committed, the key answers its email again.
    expect((await send(base, { 'idempotency-key': 'race-1' })).json()).toEqual(ok[0]!.json());
  });

  it('answers 409 while a request with the same key is still running', async () => {
    const { createEmails, requestHash } = await import('../src/shared/emails/service.js');
    const [org] = await ctx.services.orm.em.fork().execute<{ id: string }[]>('select id from organizations limit 1');
    const hash = requestHash('POST /emails', base);
    // The first request: its key held and its row inserted, its transaction not committed yet.
    const first = await holdIdempotencyKey(ctx.env.config.databaseUrl, org!.id, 'slow', hash);
    try {
      const input = { organizationId: org!.id, from: base.from, to: base.to, subject: base.subject, contentKind: 'html' as const, content: base.html };
      await expect(
        createEmails(ctx.services.orm.em.fork(), { producer: ctx.services.producer }, [input], { idempotency: { key: 'slow', requestHash: hash } }),
      ).rejects.toMatchObject({ statusCode: 409, errorName: 'idempotency_conflict' });
    } finally {
      await first.release();
    }
  });

  it('keeps keys per organization', async () => {
    const other = await createOrg(ctx.services, { name: 'Other' });
    const a = await send(base, { 'idempotency-key': 'shared' });
    const b = await send(base, { 'idempotency-key': 'shared' }, other.token);
    expect(a.json().id).not.toBe(b.json().id);
  });

  it('forgets a key after 24 hours (expired rows are replaced and purged)', async () => {
    const first = (await send(base, { 'idempotency-key': 'old' })).json().id;
    const em = ctx.services.orm.em.fork();
    await em.execute(`update email_idempotency_keys set created_at = now() - interval '25 hours' where idempotency_key = 'old'`);
    const second = (await send({ ...base, subject: 'new body is fine' }, { 'idempotency-key': 'old' })).json().id;
    expect(second).not.toBe(first);
    await em.execute(`update email_idempotency_keys set created_at = now() - interval '25 hours' where idempotency_key = 'old'`);
    const { purgeIdempotencyKeys } = await import('../src/shared/emails/service.js');
    expect(await purgeIdempotencyKeys(em)).toBe(1);
  });

  it('refuses a key over 256 characters with 422', async () => {
    const res = await send(base, { 'idempotency-key': 'k'.repeat(257) });
    expect(res.statusCode).toBe(422);
    expect(res.json().details[0].path).toBe('idempotency-key');
  });

  it('makes the batch idempotent too', async () => {
    const a = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers: { ...bearer(token), 'idempotency-key': 'b1' }, payload: [base, base] });
    const b = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers: { ...bearer(token), 'idempotency-key': 'b1' }, payload: [base, base] });
    expect(b.json()).toEqual(a.json());
  });
});

describe('POST /api/v2/emails/batch', () => {
  const batch = (payload: unknown, headers: Record<string, string> = {}) =>
    ctx.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers: { ...bearer(token), ...headers }, payload: payload as object });

  it('accepts 1..100 bodies and answers their ids in order', async () => {
    const bodies = Array.from({ length: 100 }, (_, i) => ({ ...base, subject: `n${i}` }));
    const res = await batch(bodies);
    expect(res.statusCode).toBe(200);
    const ids = res.json().data.map((d: { id: string }) => d.id);
    expect(ids).toHaveLength(100);
    expect([...ids].sort()).toEqual(ids);
    const subjects = await ctx.services.orm.em.fork().execute<{ id: string; subject: string }[]>(`select id, subject from emails where id in (${ids.map(() => '?').join(',')})`, ids);
    const byId = new Map(subjects.map((s) => [s.id, s.subject]));
    expect(ids.map((id: string) => byId.get(id))).toEqual(bodies.map((b) => b.subject));
    // Enqueued in bulk: one job that a worker fans out into a send job per email.
    const job = await ctx.services.producer.queue('emails').getJob(`batch-${ids[0]}`);
    expect(job?.name).toBe('send-batch');
    expect(job?.data).toEqual({ emailIds: ids });
  });

  it('validates all or nothing', async () => {
    const rows = await count();
    const res = await batch([base, { ...base, to: 'bad' }, base]);
    expect(res.statusCode).toBe(422);
    expect(res.json().details[0].path).toBe('1.to');
    expect(await count()).toBe(rows);
  });

  it.each([[[]], [Array.from({ length: 101 }, () => base)], [base]])('refuses a batch that is not 1..100 bodies', async (payload) => {
    expect((await batch(payload)).statusCode).toBe(422);
  });

  it('takes bodies over 1 MiB up to 10 MiB', async () => {
    const bodies = Array.from({ length: 3 }, () => ({ ...base, html: 'x'.repeat(600 * 1024) }));
    expect((await batch(bodies)).statusCode).toBe(200);
    const tooBig = Array.from({ length: 11 }, () => ({ ...base, html: 'x'.repeat(1024 * 1024) }));
    expect((await batch(tooBig)).statusCode).toBe(413);
  });
});

describe('GET /api/v2/emails and /emails/{id} (docs/emails.md)', () => {
  let org: { token: string; organizationId: string };
  let ids: string[];

  beforeAll(async () => {
    org = await createOrg(ctx.services, { name: 'Lister' });
    ids = [];
    for (let i = 0; i < 5; i++) ids.push((await send({ ...base, subject: `s${i}` }, {}, org.token)).json().id);
    // A campaign send and a test send of the same organization: excluded from the list.
    await ctx.services.orm.em.fork().execute(
      `insert into emails (id, organization_id, source, from_address, to_address, subject, content_kind, content)
       values ('eml_00000000000000000000000001', ?, 'campaign', 'a@acme.test', 'b@example.com', 'c', 'html', '<p>c</p>'),
              ('eml_zzzzzzzzzzzzzzzzzzzzzzzzz1', ?, 'test', 'a@acme.test', 'b@example.com', 't', 'html', '<p>t</p>')`,
      [org.organizationId, org.organizationId],
    );
  });

  const get = (url: string, as = org.token) => ctx.app.inject({ url, headers: bearer(as) });

  it('lists API sends newest first with last_event, without bodies', async () => {
    const res = await get('/api/v2/emails');
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toMatchObject({ object: 'list', has_more: false });
    expect(body.data.map((e: { id: string }) => e.id)).toEqual([...ids].reverse());
    expect(Object.keys(body.data[0]).sort()).toEqual(['bcc', 'cc', 'created_at', 'from', 'id', 'last_event', 'message_id', 'reply_to', 'scheduled_at', 'subject', 'to']);
    expect(body.data[0].last_event).toBe('queued');
  });

  it('pages with limit, after and before', async () => {
    const first = (await get('/api/v2/emails?limit=2')).json();
    expect(first.data.map((e: { id: string }) => e.id)).toEqual([ids[4], ids[3]]);
    expect(first.has_more).toBe(true);
    const next = (await get(`/api/v2/emails?limit=2&after=${ids[3]}`)).json();
    expect(next.data.map((e: { id: string }) => e.id)).toEqual([ids[2], ids[1]]);
    expect(next.has_more).toBe(true);
    const last = (await get(`/api/v2/emails?limit=2&after=${ids[1]}`)).json();
    expect(last.data.map((e: { id: string }) => e.id)).toEqual([ids[0]]);
    expect(last.has_more).toBe(false);
    const newer = (await get(`/api/v2/emails?limit=2&before=${ids[0]}`)).json();
    expect(newer.data.map((e: { id: string }) => e.id)).toEqual([ids[2], ids[1]]);
    expect(newer.has_more).toBe(true);
  });

  it.each([
    ['both cursors', () => `/api/v2/emails?after=${ids[1]}&before=${ids[3]}`],
    ['an unknown cursor', () => '/api/v2/emails?after=eml_01jzzzzzzzzzzzzzzzzzzzzzzz'],
    ['limit 0', () => '/api/v2/emails?limit=0'],
    ['limit 101', () => '/api/v2/emails?limit=101'],
  ])('refuses %s with 422', async (_label, url) => {
    const res = await get(url());
    expect(res.statusCode).toBe(422);
    expect(res.json().name).toBe('validation_error');
  });

  it("refuses another organization's cursor and email", async () => {
    expect((await get(`/api/v2/emails?after=${ids[1]}`, token)).statusCode).toBe(422);
    const res = await get(`/api/v2/emails/${ids[1]}`, token);
    expect(res.statusCode).toBe(404);
    expect(res.json().name).toBe('not_found');
  });

  it('gets a campaign or test email by id', async () => {
    const res = await get('/api/v2/emails/eml_00000000000000000000000001');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ object: 'email', subject: 'c', tags: [] });
  });

  it('answers 403 validation_error on both reads without the emails permission', async () => {
    const limited = (await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(org.token), payload: { name: 'subs', permissions: ['subscribers', 'tokens'] } })).json().token;
    for (const url of ['/api/v2/emails', `/api/v2/emails/${ids[0]}`]) {
      const res = await get(url, limited);
      expect(res.statusCode).toBe(403);
      expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 403 });
    }
  });

  it('answers 404 for an unknown id', async () => {
    expect((await get('/api/v2/emails/eml_nope')).statusCode).toBe(404);
  });
});

describe('lastEvent (docs/outcomes.md "`last_event`")', () => {
  const at = new Date();
  const base = { status: 'sent' as const, deliveryStatus: null, firstOpenedAt: null, firstClickedAt: null };
  it.each([
    [{ ...base, status: 'queued' as const }, 'queued'],
    [{ ...base, status: 'sending' as const }, 'queued'],
    [base, 'sent'],
    [{ ...base, status: 'failed' as const }, 'failed'],
    [{ ...base, deliveryStatus: 'delivered' as const }, 'delivered'],
    [{ ...base, deliveryStatus: 'bounced' as const }, 'bounced'],
    [{ ...base, deliveryStatus: 'complained' as const }, 'complained'],
    [{ ...base, deliveryStatus: 'delivered' as const, firstOpenedAt: at }, 'opened'],
    [{ ...base, deliveryStatus: 'bounced' as const, firstOpenedAt: at, firstClickedAt: at }, 'clicked'],
  ])('derives %o as %s', (columns, expected) => {
    expect(lastEvent(columns)).toBe(expected);
  });
});


describe('renderEmail (docs/emails.md "Rendering")', () => {
  it('keeps client HTML, adds the preheader after <body> and inlines its <style> block', async () => {
    const { renderEmail } = await import('../src/shared/emails/render.js');
    const { html, text } = renderEmail({
      contentKind: 'html',
      content: '<html><head><style>.cta { color: #ff0000; }</style></head><body><p class="cta">Buy</p></body></html>',
      subject: 's',
      preview: 'Sale <today>',
    });
    expect(html).toMatch(/<body><div class="preheader"[^>]*>Sale &lt;today&gt;<\/div><p class="cta" style="color: #ff0000;">Buy<\/p>/);
    expect(text.trim()).toBe('Buy');
  });

  it('styles generated markdown and keeps a raw tag its own style', async () => {
    const { renderEmail } = await import('../src/shared/emails/render.js');
    const { html } = renderEmail({ contentKind: 'markdown', content: 'Hi <a href="https://x.test" style="color: red">x</a> [y](https://y.test)', subject: 's' });
    expect(html).toContain('<a href="https://x.test" style="color: red">x</a>');
    expect(html).toContain('<a href="https://y.test" style="color: #2563eb;">y</a>');
    expect(html).not.toContain('class="preheader"');
  });
});

describe('classifySendError', () => {
  it.each([
    [{ responseCode: 550, response: '550 No such user' }, 'permanent'],
    [{ responseCode: 421, response: '421 Try later' }, 'throttle'],
    [{ responseCode: 454, response: '454 Throttled' }, 'throttle'],
    [{ responseCode: 432, response: '432 Temporary' }, 'transient'],
    [{ responseCode: 535, code: 'EAUTH', response: '535 Bad credentials' }, 'transient'],
    [{ code: 'ECONNECTION', message: 'connect ECONNREFUSED' }, 'transient'],
    [{ code: 'ETIMEDOUT', message: 'Connection timeout' }, 'transient'],
  ])('classifies %o as %s', async (error, kind) => {
    const { classifySendError } = await import('../src/shared/emails/transport.js');
    expect(classifySendError(error).kind).toBe(kind);
  });
});

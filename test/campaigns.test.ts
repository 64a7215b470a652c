import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { runFanOut } from '../src/shared/campaigns/fanout.js';
import { DeliveryStore, deliverEmail } from '../src/shared/emails/deliver.js';
import { HandoverFence } from '../src/shared/emails/handover.js';
import { createRedis } from '../src/shared/redis.js';
import { campaignEmailsProcessor, campaignsProcessor } from '../src/workers/campaigns.js';
import { emailsProcessor } from '../src/workers/emails.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { createSenderRow } from './helpers/campaigns.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';

let ctx: TestContext;
let sink: SmtpSink;
let token: string;
let orgId: string;
let senderId: string;
let workers: RunningWorkers | undefined;

const UNSUB_MD = '\n\n[Unsubscribe]({{unsubscribe_url}})';

beforeAll(async () => {
  sink = await startSmtpSink();
  ctx = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, CAMPAIGN_FANOUT_PAGE: '3' });
  ({ token, organizationId: orgId } = await createOrg(ctx.services));
  // Open/click tracking is tested in outcomes.test.ts; here the received links are the content's.
  await ctx.services.orm.em.fork().execute('update organizations set track_opens = false, track_clicks = false where id = ?', [orgId]);
  senderId = await createSenderRow(ctx.services, orgId);
});
afterAll(async () => {
  await workers?.close();
  await ctx?.close();
  await sink?.close();
});

function api(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, body?: unknown, as = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(as), ...(body === undefined ? {} : { payload: body as object }) });
}

async function createCampaign(body: Record<string, unknown>) {
  const res = await api('POST', '/campaigns', { name: 'Newsletter', subject: 'Hello {{name}}', senderId, ...body });
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

async function subscriber(email: string, extra: Record<string, unknown> = {}) {
  const res = await api('POST', '/subscribers', { email, ...extra });
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

async function waitFor<T>(check: () => Promise<T | undefined | false>, timeoutMs = 15_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function sql<T>(query: string, params: unknown[] = []): Promise<T[]> {
  return ctx.services.orm.em.fork().execute(query, params, 'all') as Promise<T[]>;
}

async function startAllWorkers() {
  workers ??= await startWorkers(ctx.services, createRedis(ctx.env.config.redisUrl, 'worker'), [
    campaignsProcessor,
    campaignEmailsProcessor,
    emailsProcessor,
  ] as never);
}

describe('POST/GET /api/v2/campaigns (docs/campaigns.md)', () => {
  it('creates a DRAFT with the get shape', async () => {
    const body = await createCampaign({ content: `# Hi${UNSUB_MD}`, preview: 'Read me' });
    expect(body).toMatchObject({
      object: 'campaign',
      name: 'Newsletter',
      subject: 'Hello {{name}}',
      status: 'DRAFT',
      contentType: 'MARKDOWN',
      preview: 'Read me',
      senderId,
      sender: { id: senderId, name: 'Acme News', email: 'news@example.test' },
      recipientFilters: [],
      emailsSentCount: 0,
      scheduledAt: null,
      sendAt: null,
      replyTo: null,
    });
    expect(body.id).toMatch(/^cmp_[0-9a-z]{26}$/);
    const got = await api('GET', `/campaigns/${body.id}`);
    expect(got.statusCode).toBe(200);
    expect(got.json().id).toBe(body.id);
  });

  it('refuses bad input with 422 naming the field, and writes nothing', async () => {
    const before = (await sql<{ n: number }>('select count(*)::int as n from campaigns'))[0]!.n;
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ name: 'x'.repeat(101) }, 'name'],
      [{ senderId: 'snd_01jxxxxxxxxxxxxxxxxxxxxxxx' }, 'senderId'],
      [{ contentType: 'MAILY', content: '{not json' }, 'content'],
      [{ contentType: 'MAILY', content: { type: 'paragraph' } }, 'content'],
      [{ contentType: 'PLATE', content: { foo: 1 } }, 'content'],
      [{ contentType: 'MARKDOWN', content: { type: 'doc' } }, 'content'],
      [{ recipientFilters: [{ type: 'tag', op: 'maybe', value: 'x' }] }, 'recipientFilters.0.op'],
      [{ recipientFilters: [{ type: 'field', name: 'plan', op: 'eq' }] }, 'recipientFilters.0.value'],
      [{ recipientFilters: [{ type: 'segment' }] }, 'recipientFilters.0.type'],
    ];
    for (const [body, path] of cases) {
      const res = await api('POST', '/campaigns', { name: 'Bad', ...body });
      expect(res.statusCode, JSON.stringify(body)).toBe(422);
      expect(res.json().name).toBe('validation_error');
      expect(res.json().details.map((d: { path: string }) => d.path), JSON.stringify(body)).toContain(path);
    }
    expect((await sql<{ n: number }>('select count(*)::int as n from campaigns'))[0]!.n).toBe(before);
  });

  it('accepts MAILY and PLATE content as an object or a JSON string', async () => {
    const plate = [{ type: 'p', children: [{ text: 'Hi' }] }];
    const a = await createCampaign({ contentType: 'PLATE', content: JSON.stringify(plate) });
    expect(a.content).toEqual(plate);
    const maily = { type: 'doc', content: [{ type: 'paragraph', content: [{ type: 'text', text: 'Hi' }] }] };
    const b = await createCampaign({ contentType: 'MAILY', content: maily });
    expect(b.content).toEqual(maily);
  });

  it('lists newest first with limit, after and status', async () => {
    const other = await createOrg(ctx.services, { name: 'Other' });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await api('POST', '/campaigns', { name: `c${i}` }, other.token);
      ids.push(res.json().id);
    }
    const page1 = await api('GET', '/campaigns?limit=2', undefined, other.token);
    expect(page1.json()).toMatchObject({ object: 'list', has_more: true });
    expect(page1.json().data.map((c: { id: string }) => c.id)).toEqual([ids[2], ids[1]]);
    const page2 = await api('GET', `/campaigns?limit=2&after=${ids[1]}`, undefined, other.token);
    expect(page2.json()).toMatchObject({ has_more: false, data: [{ id: ids[0] }] });
    // `before` pages back towards the newest, still newest first (docs/foundation.md "Identifiers, time and lists").
    const back = await api('GET', `/campaigns?limit=1&before=${ids[0]}`, undefined, other.token);
    expect(back.json()).toMatchObject({ has_more: true, data: [{ id: ids[1] }] });
    const newest = await api('GET', `/campaigns?limit=5&before=${ids[0]}`, undefined, other.token);
    expect(newest.json()).toMatchObject({ has_more: false });
    expect(newest.json().data.map((c: { id: string }) => c.id)).toEqual([ids[2], ids[1]]);
    // One cursor at a time, and each one a campaign of the organization.
    for (const query of [`after=${ids[1]}&before=${ids[1]}`, 'before=cmp_nope', `before=${ids[0]}`]) {
      const refused = await api('GET', `/campaigns?${query}`, undefined, query.includes('nope') || query.includes('&') ? other.token : undefined);
      expect(refused.statusCode, query).toBe(422);
    }
    expect((await api('GET', '/campaigns?status=SENT', undefined, other.token)).json().data).toEqual([]);
    // A status narrows the page, not the cursor: a campaign of another status still is one.
    await ctx.services.orm.em.fork().execute(`update campaigns set status = 'SENT' where id = ?`, [ids[1]]);
    const olderDrafts = await api('GET', `/campaigns?status=DRAFT&after=${ids[1]}`, undefined, other.token);
    expect(olderDrafts.json()).toMatchObject({ has_more: false, data: [{ id: ids[0] }] });
    const newerDrafts = await api('GET', `/campaigns?status=DRAFT&before=${ids[1]}`, undefined, other.token);
    expect(newerDrafts.json()).toMatchObject({ has_more: false, data: [{ id: ids[2] }] });
    expect((await api('GET', '/campaigns?limit=0', undefined, other.token)).statusCode).toBe(422);
    // Another organization's campaign is 404.
    expect((await api('GET', `/campaigns/${ids[0]}`)).statusCode).toBe(404);
    expect((await api('GET', '/campaigns/cmp_nope')).statusCode).toBe(404);
  });

  it('needs permission campaigns', async () => {
    const limited = (await api('POST', '/tokens', { name: 'app', preset: 'app' })).json().token;
    const res = await api('GET', '/campaigns', undefined, limited);
    expect(res.statusCode).toBe(403);
    expect(res.json().name).toBe('missing_permission');
  });
});

describe('recipient filters and recipientCount (docs/campaigns.md "Recipient filters")', () => {
  it('counts SUBSCRIBED contacts matching every filter, live for drafts', async () => {
    const o = await createOrg(ctx.services, { name: 'Filters' });
    const post = (body: unknown) => api('POST', '/subscribers', body, o.token);
    await post({ email: 'a@f.test', tags: ['VIP'], fields: { plan: 'pro' } });
    await post({ email: 'b@f.test', tags: ['vip'], fields: { plan: 'free' } });
    await post({ email: 'c@f.test', fields: { plan: 'pro' } });
    await post({ email: 'd@f.test' });
    const e = (await post({ email: 'e@f.test', tags: ['VIP'], fields: { plan: 'pro' } })).json();
    await api('POST', `/subscribers/${e.id}/unsubscribe`, {}, o.token);
    const count = async (recipientFilters: unknown[]) => {
      const res = await api('POST', '/campaigns', { name: 'f', recipientFilters }, o.token);
      expect(res.statusCode, res.body).toBe(200);
      return res.json().recipientCount;
    };
    expect(await count([])).toBe(4);
    expect(await count([{ type: 'tag', op: 'has', value: 'vip' }])).toBe(2);
    expect(await count([{ type: 'tag', op: 'not_has', value: 'VIP' }])).toBe(2);
    expect(await count([{ type: 'field', name: 'plan', op: 'eq', value: 'pro' }])).toBe(2);
    expect(await count([{ type: 'field', name: 'plan', op: 'neq', value: 'pro' }])).toBe(2);
    expect(await count([{ type: 'field', name: 'plan', op: 'exists' }])).toBe(3);
    expect(await count([{ type: 'field', name: 'plan', op: 'not_exists' }])).toBe(1);
    expect(await count([{ type: 'tag', op: 'has', value: 'VIP' }, { type: 'field', name: 'plan', op: 'eq', value: 'pro' }])).toBe(1);
    // Live: a new subscriber changes a draft's count.
    const draft = (await api('POST', '/campaigns', { name: 'live' }, o.token)).json();
    await post({ email: 'f@f.test' });
    expect((await api('GET', `/campaigns/${draft.id}`, undefined, o.token)).json().recipientCount).toBe(5);
  });

  it('keeps a filter on the same contacts when its tag is renamed', async () => {
    const o = await createOrg(ctx.services, { name: 'Renames' });
    const post = (body: unknown) => api('POST', '/subscribers', body, o.token);
    await post({ email: 'vip1@r.test', tags: ['VIP'] });
    await post({ email: 'vip2@r.test', tags: ['VIP'] });
    await post({ email: 'other@r.test' });
    const filters = [{ type: 'tag', op: 'not_has', value: 'vip' }, { type: 'field', name: 'plan', op: 'not_exists' }];
    const c = (await api('POST', '/campaigns', { name: 'Not VIPs', recipientFilters: filters }, o.token)).json();
    expect(c.recipientCount).toBe(1);
    expect((await api('PATCH', '/tags/VIP', { name: 'Gold' }, o.token)).statusCode).toBe(200);
    const after = (await api('GET', `/campaigns/${c.id}`, undefined, o.token)).json();
    expect(after.recipientFilters).toEqual([{ type: 'tag', op: 'not_has', value: 'Gold' }, { type: 'field', name: 'plan', op: 'not_exists' }]);
    expect(after.recipientCount).toBe(1);
    // Two renames at once: the filters follow the name the tag ends with.
    for (let round = 0; round < 5; round++) {
      const tag = (await api('GET', '/tags', undefined, o.token)).json().data.find((t: { name: string }) => /^gold|^silver|^bronze/i.test(t.name));
      await Promise.all([api('PATCH', `/tags/${tag.id}`, { name: `Silver${round}` }, o.token), api('PATCH', `/tags/${tag.id}`, { name: `Bronze${round}` }, o.token)]);
      const final = (await api('GET', `/tags/${tag.id}`, undefined, o.token)).json().name;
      expect((await api('GET', `/campaigns/${c.id}`, undefined, o.token)).json().recipientFilters[0].value, `round ${round}`).toBe(final);
    }
  });
});

describe('PATCH /api/v2/campaigns/:id (docs/campaigns.md "API decisions")', () => {
  it('changes a draft, lists updatedFields and warns about ignored fields', async () => {
    const c = await createCampaign({ content: 'Hi' });
    const res = await api('PATCH', `/campaigns/${c.id}`, { name: 'Renamed', subject: 'Hello {{name}}', scheduledAt: '2030-01-01T00:00:00Z', colour: 'red' });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ id: c.id, name: 'Renamed', status: 'DRAFT', updatedFields: ['name'] });
    expect(res.json().warnings).toHaveLength(2);
    const none = await api('PATCH', `/campaigns/${c.id}`, { name: 'Renamed' });
    expect(none.json().updatedFields).toEqual([]);
    expect(none.json().warnings).toBeUndefined();
    const remapped = await api('PATCH', `/campaigns/${c.id}`, { contentType: 'PLATE', content: JSON.stringify([{ type: 'p', children: [{ text: 'x' }] }]) });
    expect(remapped.json().updatedFields).toEqual(['content', 'contentType']);
    expect(remapped.json().warnings).toHaveLength(1);
  });

  it('refuses invalid fields and non-drafts with 422, campaign unchanged', async () => {
    const c = await createCampaign({ content: `Hi${UNSUB_MD}` });
    expect((await api('PATCH', `/campaigns/${c.id}`, { name: 'y'.repeat(101) })).statusCode).toBe(422);
    expect((await api('PATCH', `/campaigns/${c.id}`, { contentType: 'MAILY' })).json().details[0].path).toBe('contentType');
    expect((await api('PATCH', `/campaigns/${c.id}`, { senderId: 'snd_x' })).json().details[0].path).toBe('senderId');
    expect((await api('GET', `/campaigns/${c.id}`)).json()).toMatchObject({ name: 'Newsletter', contentType: 'MARKDOWN' });
    await api('POST', `/campaigns/${c.id}/send`, { scheduledAt: '2099-01-01T00:00:00Z' });
    const res = await api('PATCH', `/campaigns/${c.id}`, { name: 'late' });
    expect(res.statusCode).toBe(422);
    expect(res.json().name).toBe('validation_error');
  });
});

describe('POST /api/v2/campaigns/:id/send (docs/campaigns.md "API decisions")', () => {
  it('refuses with 400 naming the reason', async () => {
    const noLink = await createCampaign({ content: 'Unsubscribe: {{unsubscribe_url}}' });
    const r1 = await api('POST', `/campaigns/${noLink.id}/send`, {});
    expect(r1.statusCode).toBe(400);
    expect(r1.json()).toMatchObject({ name: 'validation_error', details: [{ path: 'content' }] });
    // HTML that holds no link a reader can click: a comment, a textarea, a template, a <link>.
    for (const hidden of [
      '<!-- <a href="{{unsubscribe_url}}">Unsubscribe</a> -->',
      '<textarea><a href="{{unsubscribe_url}}">Unsubscribe</a></textarea>',
      '<template><a href="{{unsubscribe_url}}">Unsubscribe</a></template>',
      '<link rel="x" href="{{unsubscribe_url}}">',
    ]) {
      const c = await createCampaign({ content: `Hi\n\n${hidden}\n` });
      const res = await api('POST', `/campaigns/${c.id}/send`, {});
      expect(res.statusCode, hidden).toBe(400);
      expect(res.json().details[0].path, hidden).toBe('content');
    }
    // An HTML link a reader can click does count.
    const htmlLink = await createCampaign({ content: 'Hi\n\n<p><a href="{{ unsubscribe_url }}">Unsubscribe</a></p>\n', recipientFilters: [{ type: 'tag', op: 'has', value: 'nobody-has-this-tag' }] });
    expect((await api('POST', `/campaigns/${htmlLink.id}/send`, { scheduledAt: '2031-01-01T00:00:00Z' })).statusCode).toBe(200);
    expect((await api('DELETE', `/campaigns/${htmlLink.id}`)).statusCode).toBe(200);
    const noSender = await createCampaign({ content: `Hi${UNSUB_MD}`, senderId: null });
    expect((await api('POST', `/campaigns/${noSender.id}/send`, {})).json()).toMatchObject({ statusCode: 400, details: [{ path: 'senderId' }] });
    const ok = await createCampaign({ content: `Hi${UNSUB_MD}` });
    const path = async (body: unknown) => {
      const res = await api('POST', `/campaigns/${ok.id}/send`, body);
      expect(res.statusCode, res.body).toBe(400);
      return res.json().details[0].path;
    };
    expect(await path({ scheduledAt: '2001-01-01T00:00:00Z' })).toBe('scheduledAt');
    expect(await path({ scheduledAt: 'next tuesday' })).toBe('scheduledAt');
    expect(await path({ scheduledAt: '2030-02-30T10:00' })).toBe('scheduledAt');
    // Content nested deeper than the renderers take (raw HTML in markdown) is refused before it is parsed.
    const deep = await createCampaign({ content: `${'<div>'.repeat(1_001)}[Unsubscribe]({{unsubscribe_url}})` });
    const refused = await api('POST', `/campaigns/${deep.id}/send`, {});
    expect(refused.statusCode).toBe(400);
    expect(refused.json().details).toEqual([{ path: 'content', message: 'is nested deeper than 1000 elements' }]);
    // Block quotes nested past what the markdown parser takes in time and memory.
    const quoted = await createCampaign({ content: `${'>'.repeat(101)} [Unsubscribe]({{unsubscribe_url}})` });
    const tooDeep = await api('POST', `/campaigns/${quoted.id}/send`, {});
    expect(tooDeep.statusCode).toBe(400);
    expect(tooDeep.json().details).toEqual([{ path: 'content', message: 'markdown is nested deeper than 100 levels (block quotes and lists)' }]);
    // An offset beyond RFC 3339's bounds would move the send by days.
    for (const scheduledAt of ['2030-07-15T09:00:00+99:99', '2030-07-15T09:00:00+24:00', '2030-07-15T09:00-0560']) expect(await path({ scheduledAt })).toBe('scheduledAt');
    expect(await path({ timezone: 'Mars/Olympus' })).toBe('timezone');
    expect(await path({ extra: 1 })).toBeDefined();
    expect((await api('GET', `/campaigns/${ok.id}`)).json().status).toBe('DRAFT');
    const limited = (await api('POST', '/tokens', { name: 'marketing', preset: 'marketing' })).json().token;
    expect((await api('POST', `/campaigns/${ok.id}/send`, {}, limited)).statusCode).toBe(403);
  });

  it('schedules a wall-clock time in the timezone, freezes recipientCount, and delays the job', async () => {
    const c = await createCampaign({ content: `Hi${UNSUB_MD}` });
    const res = await api('POST', `/campaigns/${c.id}/send`, { scheduledAt: '2030-01-15T09:00', timezone: 'America/New_York' });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toEqual({
      id: c.id,
      campaignId: c.id,
      subject: 'Hello {{name}}',
      status: 'SCHEDULED',
      scheduledAt: '2030-01-15T14:00:00.000Z',
      timezone: 'America/New_York',
      recipientCount: expect.any(Number),
    });
    const paris = await createCampaign({ content: `Hi${UNSUB_MD}` });
    const r2 = await api('POST', `/campaigns/${paris.id}/send`, { scheduledAt: '2030-07-15T09:00:00' });
    expect(r2.json().scheduledAt).toBe('2030-07-15T07:00:00.000Z');
    expect(r2.json().timezone).toBeUndefined();
    const abs = await createCampaign({ content: `Hi${UNSUB_MD}` });
    expect((await api('POST', `/campaigns/${abs.id}/send`, { scheduledAt: '2030-07-15T09:00:00+02:00', timezone: 'Asia/Tokyo' })).json().scheduledAt).toBe(
      '2030-07-15T07:00:00.000Z',
    );
    // A zone name in another case is the zone, kept by its canonical name.
    const lower = await createCampaign({ content: `Hi${UNSUB_MD}` });
    const lowerSent = await api('POST', `/campaigns/${lower.id}/send`, { scheduledAt: '2030-07-15T09:00', timezone: 'europe/paris' });
    expect(lowerSent.json()).toMatchObject({ scheduledAt: '2030-07-15T07:00:00.000Z', timezone: 'Europe/Paris' });
    expect((await api('GET', `/campaigns/${lower.id}`)).json().timezone).toBe('Europe/Paris');
    // Only the case: a current name stays itself (ICU's own preference is a legacy alias).
    const kolkata = await createCampaign({ content: `Hi${UNSUB_MD}` });
    expect((await api('POST', `/campaigns/${kolkata.id}/send`, { scheduledAt: '2030-07-15T09:00', timezone: 'Asia/Kolkata' })).json().timezone).toBe('Asia/Kolkata');
    const calcutta = await createCampaign({ content: `Hi${UNSUB_MD}` });
    expect((await api('POST', `/campaigns/${calcutta.id}/send`, { scheduledAt: '2030-07-15T09:00', timezone: 'asia/calcutta' })).json().timezone).toBe('Asia/Calcutta');
    const job = await ctx.services.producer.queue('campaigns').getJob(c.id);
    expect(await job?.getState()).toBe('delayed');
    expect(job!.opts.delay).toBeGreaterThan(1e8);
    const got = (await api('GET', `/campaigns/${c.id}`)).json();
    expect(got).toMatchObject({ status: 'SCHEDULED', scheduledAt: '2030-01-15T14:00:00.000Z', timezone: 'America/New_York' });
    const again = await api('POST', `/campaigns/${c.id}/send`, {});
    expect(again.statusCode).toBe(400);
    expect(again.json().details[0].path).toBe('status');
  });

  it('sends now with no body at all, and takes null as absent (docs/campaigns.md: both fields optional)', async () => {
    // Sent to nobody (a tag no subscriber has): the sink of the tests below counts its messages.
    const nobody = [{ type: 'tag', op: 'has', value: 'nobody-has-this-tag' }];
    const bare = await createCampaign({ content: `Hi${UNSUB_MD}`, recipientFilters: nobody });
    const before = Date.now();
    const res = await api('POST', `/campaigns/${bare.id}/send`);
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ status: 'SCHEDULED' });
    expect(res.json().timezone).toBeUndefined();
    expect(Date.parse(res.json().scheduledAt)).toBeGreaterThanOrEqual(before - 1000);
    // The same with a JSON content type and no bytes (what many clients send).
    const typed = await createCampaign({ content: `Hi${UNSUB_MD}`, recipientFilters: nobody });
    const empty = await ctx.app.inject({ method: 'POST', url: `/api/v2/campaigns/${typed.id}/send`, headers: { ...bearer(token), 'content-type': 'application/json' }, payload: '' });
    expect(empty.statusCode, empty.body).toBe(200);
    const nulls = await createCampaign({ content: `Hi${UNSUB_MD}`, recipientFilters: nobody });
    const r2 = await api('POST', `/campaigns/${nulls.id}/send`, { scheduledAt: null, timezone: null });
    expect(r2.statusCode, r2.body).toBe(200);
    expect(r2.json().timezone).toBeUndefined();
  });

  it('moves a wall-clock time skipped by a daylight-saving change forward by the gap', async () => {
    const c = await createCampaign({ content: `Hi${UNSUB_MD}` });
    // 2030-03-31 02:30 does not exist in Paris (02:00 -> 03:00): it is 03:30 CEST, 01:30 UTC.
    const res = await api('POST', `/campaigns/${c.id}/send`, { scheduledAt: '2030-03-31T02:30', timezone: 'Europe/Paris' });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json().scheduledAt).toBe('2030-03-31T01:30:00.000Z');
  });

  it('lets only one of a PATCH and a send at the same moment through: no send of content it never checked', async () => {
    for (let round = 0; round < 8; round++) {
      const c = await createCampaign({ content: `Hi${UNSUB_MD}` });
      const [patch, send] = await Promise.all([
        api('PATCH', `/campaigns/${c.id}`, { content: 'No unsubscribe link here', subject: `Changed ${round}` }),
        api('POST', `/campaigns/${c.id}/send`, { scheduledAt: '2031-01-01T00:00:00Z' }),
      ]);
      const stored = (await api('GET', `/campaigns/${c.id}`)).json();
      if (send.statusCode === 200) {
        // The send went first: the PATCH found a campaign that was no longer a draft.
        expect(patch.statusCode, patch.body).toBe(422);
        expect(stored).toMatchObject({ status: 'SCHEDULED', subject: 'Hello {{name}}', content: `Hi${UNSUB_MD}` });
        expect(send.json()).toMatchObject({ subject: 'Hello {{name}}' });
      } else {
        // The PATCH went first: the send checked the content it wrote.
        expect(patch.statusCode, patch.body).toBe(200);
        expect(send.statusCode, send.body).toBe(400);
        expect(send.json().message).toMatch(/unsubscribe/);
        expect(stored).toMatchObject({ status: 'DRAFT', content: 'No unsubscribe link here' });
      }
    }
  });

  it('deletes a scheduled campaign and cancels its job', async () => {
    const c = await createCampaign({ content: `Hi${UNSUB_MD}` });
    await api('POST', `/campaigns/${c.id}/send`, { scheduledAt: '2031-01-01T00:00:00Z' });
    const res = await api('DELETE', `/campaigns/${c.id}`);
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ object: 'campaign', id: c.id, deleted: true });
    expect(await ctx.services.producer.queue('campaigns').getJob(c.id)).toBeUndefined();
    expect((await api('GET', `/campaigns/${c.id}`)).statusCode).toBe(404);
    expect((await api('DELETE', `/campaigns/${c.id}`)).statusCode).toBe(404);
  });
});

describe('sending: MARKDOWN, MAILY and PLATE reach every matching subscriber (docs/campaigns.md, docs/outcomes.md "Tokens")', () => {
  const MAILY = {
    type: 'doc',
    content: [
      { type: 'logo', attrs: { src: 'https://cdn.example.test/logo.png', alt: 'Acme', size: 'md', alignment: 'left' } },
      { type: 'heading', attrs: { level: 1 }, content: [{ type: 'text', text: 'Maily news' }] },
      {
        type: 'paragraph',
        content: [
          { type: 'text', text: 'Hi ' },
          { type: 'variable', attrs: { id: 'name' } },
          { type: 'text', text: ', plan ' },
          { type: 'variable', attrs: { id: 'fields.plan' } },
          { type: 'text', text: ' see ' },
          { type: 'text', text: 'our site', marks: [{ type: 'link', attrs: { href: 'https://example.test/site' } }, { type: 'bold' }] },
        ],
      },
      { type: 'bulletList', content: [{ type: 'listItem', content: [{ type: 'paragraph', content: [{ type: 'text', text: 'item one' }] }] }] },
      { type: 'image', attrs: { src: 'https://cdn.example.test/pic.png', alt: 'Picture' } },
      { type: 'spacer', attrs: { height: 24 } },
      { type: 'button', attrs: { text: 'Read more', url: 'https://example.test/more', alignment: 'center' } },
      { type: 'columns', content: [{ type: 'column', attrs: { width: 50 }, content: [{ type: 'paragraph', content: [{ type: 'text', text: 'left col' }] }] }] },
      { type: 'footer', content: [{ type: 'text', text: 'Unsubscribe', marks: [{ type: 'link', attrs: { href: '{{unsubscribe_url}}' } }] }] },
    ],
  };
  const PLATE = [
    { type: 'h2', children: [{ text: 'Plate news' }] },
    { type: 'p', children: [{ text: 'Hi ' }, { text: '{{name}}', bold: true }, { text: ' on {{fields.plan}}, ' }, { type: 'a', url: 'https://example.test/p', children: [{ text: 'link' }] }] },
    { type: 'blockquote', children: [{ text: 'quoted', italic: true }] },
    { type: 'ul', children: [{ type: 'li', children: [{ type: 'lic', children: [{ text: 'plate item' }] }] }] },
    { type: 'code_block', children: [{ type: 'code_line', children: [{ text: 'const a = 1;' }] }] },
    { type: 'img', url: 'https://cdn.example.test/p.png', children: [{ text: '' }] },
    { type: 'p', children: [{ type: 'a', url: '{{unsubscribe_url}}', children: [{ text: 'Unsubscribe' }] }] },
  ];
  const MARKDOWN = `# Markdown news\n\nHi **{{name}}** <{{email}}> on {{fields.plan}}, unknown "{{nope}}".\n\n- md item\n\n[Unsubscribe]({{unsubscribe_url}})`;

  it('counts the recipients the fan-out wrote once it is done: a subscriber who came after scheduling counts, and sent never exceeds recipients', async () => {
    const tag = 'late-comers';
    await subscriber('early@late.test', { tags: [tag] });
    const c = await createCampaign({ content: `Hi${UNSUB_MD}`, recipientFilters: [{ type: 'tag', op: 'has', value: tag }] });
    const sent = await api('POST', `/campaigns/${c.id}/send`, { scheduledAt: new Date(Date.now() + 1_500).toISOString() });
    expect(sent.json().recipientCount).toBe(1);
    await subscriber('late@late.test', { tags: [tag] });
    await startAllWorkers();
    const done = await waitFor(async () => {
      const got = (await api('GET', `/campaigns/${c.id}`)).json();
      return got.status === 'SENT' && got;
    });
    expect(done).toMatchObject({ emailsSentCount: 2, recipientCount: 2 });
  });

  it.each([
    ['MARKDOWN', MARKDOWN, 'Markdown news', ['md item']],
    ['MAILY', MAILY, 'Maily news', ['item one', 'Read more', 'https://example.test/more', 'https://cdn.example.test/pic.png', 'left col']],
    ['PLATE', PLATE, 'Plate news', ['plate item', 'const a = 1;', 'https://cdn.example.test/p.png', 'quoted']],
  ] as const)('%s', async (contentType, content, heading, expected) => {
    await startAllWorkers();
    const tag = `t${contentType.toLowerCase()}`;
    const domain = `${contentType.toLowerCase()}.test`;
    // Matching: tagged and SUBSCRIBED; one has a name with HTML in it (escaped).
    const matching = [
      await subscriber(`ann@${domain}`, { name: 'Ann <b>&</b>', tags: [tag], fields: { plan: 'pro' } }),
      await subscriber(`bob@${domain}`, { name: 'Bob', tags: [tag], fields: { plan: 'free' } }),
      await subscriber(`cid@${domain}`, { tags: [tag] }),
    ];
    await subscriber(`out@${domain}`, { name: 'Not tagged' });
    const gone = await subscriber(`gone@${domain}`, { tags: [tag] });
    await api('POST', `/subscribers/${gone.id}/unsubscribe`, {});

    const c = await createCampaign({ contentType, content, subject: 'News for {{name}}', recipientFilters: [{ type: 'tag', op: 'has', value: tag }] });
    const sent = await api('POST', `/campaigns/${c.id}/send`, {});
    expect(sent.statusCode, sent.body).toBe(200);
    expect(sent.json().recipientCount).toBe(3);
    const done = await waitFor(async () => {
      const got = (await api('GET', `/campaigns/${c.id}`)).json();
      return got.status === 'SENT' && got;
    });
    expect(done).toMatchObject({ emailsSentCount: 3, recipientCount: 3 });
    expect(done.sendAt).not.toBeNull();
    const mails = await waitFor(async () => {
      const got = sink.messages.filter((m) => m.to && JSON.stringify(m.to).includes(`@${domain}`));
      return got.length >= 3 && got;
    });
    await new Promise((r) => setTimeout(r, 100));
    expect(sink.messages.filter((m) => JSON.stringify(m.to).includes(`@${domain}`))).toHaveLength(3);
    for (const s of matching) {
      const mail = mails.find((m) => JSON.stringify(m.to).includes(s.email))!;
      expect(mail, s.email).toBeDefined();
      const html = String(mail.html);
      expect(html).toContain(heading);
      for (const e of expected) expect(html).toContain(e);
      expect(mail.subject).toBe(`News for ${s.name ?? ''}`.trim());
      if (s.name === 'Ann <b>&</b>') {
        expect(html).toContain('Ann &lt;b&gt;&amp;&lt;/b&gt;');
        expect(html).not.toContain('<b>&</b>');
        expect(html).toContain('pro');
      }
      if (contentType === 'MARKDOWN') {
        expect(html).toContain(s.email);
        expect(html).toContain('unknown &quot;&quot;');
      }
      const listUnsub = mail.headerLines.find((h) => h.key === 'list-unsubscribe')?.line ?? '';
      const url = /<(http[^>]+)>/.exec(listUnsub)![1]!;
      expect(mail.headerLines.find((h) => h.key === 'list-unsubscribe-post')?.line).toBe('List-Unsubscribe-Post: List-Unsubscribe=One-Click');
      expect(html).toContain(`href="${url}"`);
      expect(html).not.toContain('unsubscribe_url');
      const path = new URL(url).pathname;
      // GET shows a confirm page and changes nothing.
      const page = await ctx.app.inject({ method: 'GET', url: path });
      expect(page.statusCode).toBe(200);
      expect(page.body).toContain('<form method="post"');
      expect((await api('GET', `/subscribers/${s.id}`)).json().status).toBe('SUBSCRIBED');
      // RFC 8058 one-click POST unsubscribes.
      const post = await ctx.app.inject({
        method: 'POST',
        url: path,
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        payload: 'List-Unsubscribe=One-Click',
      });
      expect(post.statusCode, post.body).toBe(200);
      expect((await api('GET', `/subscribers/${s.id}`)).json().status).toBe('UNSUBSCRIBED');
      // Again, with a body declared as JSON that does not parse: any body, the same answer.
      const odd = await ctx.app.inject({ method: 'POST', url: path, headers: { 'content-type': 'application/json' }, payload: '{not json' });
      expect(odd.statusCode, odd.body).toBe(200);
      // Forged: 404.
      const forged = await ctx.app.inject({ method: 'POST', url: `${path.slice(0, -2)}xx` });
      expect(forged.statusCode).toBe(404);
      expect((await ctx.app.inject({ method: 'GET', url: '/u/forged.token' })).statusCode).toBe(404);
    }
    // Campaign emails are readable by id but not listed.
    const [row] = await sql<{ id: string }>(`select id from emails where campaign_id = ? limit 1`, [c.id]);
    const byId = await api('GET', `/emails/${row!.id}`);
    expect(byId.statusCode).toBe(200);
    // The row holds no body until sent (the send path personalises the campaign's template);
    // once sent it shows the subject and HTML that went out.
    expect(byId.json().subject).toMatch(/^News for /);
    expect(byId.json().subject).not.toContain('{{');
    expect(byId.json().html).toContain(heading);
    expect(byId.json().html).not.toContain('unsubscribe_url');
    const listed = (await api('GET', '/emails?limit=100')).json().data.map((e: { id: string }) => e.id);
    expect(listed).not.toContain(row!.id);
  });

  it('sends a test email (source test), not listed', async () => {
    await startAllWorkers();
    const c = await createCampaign({ content: `Test **{{email}}**${UNSUB_MD}` });
    const res = await api('POST', `/campaigns/${c.id}/test`, { to: 'tester@qa.test' });
    expect(res.statusCode, res.body).toBe(200);
    const mail = await waitFor(async () => sink.messages.find((m) => JSON.stringify(m.to).includes('tester@qa.test')));
    expect(String(mail.html)).toContain('tester@qa.test');
    // The unsubscribe headers of a campaign email, pointing at the test-send page (nothing to unsubscribe).
    const unsubscribe = `${ctx.env.config.publicUrl}/u/test`;
    expect(mail.headerLines.find((h) => h.key === 'list-unsubscribe')?.line).toBe(`List-Unsubscribe: <${unsubscribe}>`);
    expect(mail.headerLines.find((h) => h.key === 'list-unsubscribe-post')?.line).toBe('List-Unsubscribe-Post: List-Unsubscribe=One-Click');
    expect(String(mail.html)).toContain(`href="${unsubscribe}"`);
    for (const method of ['GET', 'POST'] as const) {
      const page = await ctx.app.inject({ method, url: '/u/test', ...(method === 'POST' ? { payload: 'List-Unsubscribe=One-Click', headers: { 'content-type': 'application/x-www-form-urlencoded' } } : {}) });
      expect(page.statusCode, method).toBe(200);
      expect(page.body).toContain('This was a test send');
    }
    const [row] = await sql<{ source: string }>('select source from emails where id = ?', [res.json().id]);
    expect(row!.source).toBe('test');
    expect((await api('GET', '/emails?limit=100')).json().data.map((e: { id: string }) => e.id)).not.toContain(res.json().id);
    expect((await api('GET', `/campaigns/${c.id}`)).json().status).toBe('DRAFT');
    expect((await api('POST', `/campaigns/${c.id}/test`, { to: 'nope' })).statusCode).toBe(422);
  });
});

describe('a campaign email the relay refuses', () => {
  it('keeps the personalised subject and body it was sent with', async () => {
    await startAllWorkers();
    const o = await createOrg(ctx.services, { name: 'Refused' });
    const sid = await createSenderRow(ctx.services, o.organizationId, 'news@refused.test');
    expect((await api('POST', '/subscribers', { email: 'gone@refused.test', name: 'Gone' }, o.token)).statusCode).toBe(200);
    sink.answer = (rcpt) => (rcpt === 'gone@refused.test' ? { code: 550, message: 'No such user here' } : undefined);
    try {
      const c = (await api('POST', '/campaigns', { name: 'refused', subject: 'Hello {{name}}', senderId: sid, content: `Hi **{{name}}**${UNSUB_MD}` }, o.token)).json();
      expect((await api('POST', `/campaigns/${c.id}/send`, {}, o.token)).statusCode).toBe(200);
      await waitFor(async () => (await api('GET', `/campaigns/${c.id}`, undefined, o.token)).json().status === 'FAILED');
      const [row] = await sql<{ status: string; subject: string; html: string | null }>('select status, subject, html from emails where campaign_id = ?', [c.id]);
      // As a sent campaign email's row holds them (the template's subject until then).
      expect(row).toMatchObject({ status: 'failed', subject: 'Hello Gone' });
      expect(row!.html).toContain('<strong>Gone</strong>');
    } finally {
      sink.answer = undefined;
    }
  });
});

describe('fan-out edge cases', () => {
  /**
   * A new organization's campaign to `locals`@`domain`, fanned out by the fan-out worker alone:
   * its emails stay queued until `fanOnly` is closed and the send workers start.
   */
  async function fannedOutOnly(name: string, domain: string, locals: string[]) {
    const o = await createOrg(ctx.services, { name });
    const sid = await createSenderRow(ctx.services, o.organizationId, `${name.toLowerCase()}@${domain}`);
    await workers?.close();
    workers = undefined;
    const fanOnly = await startWorkers(ctx.services, createRedis(ctx.env.config.redisUrl, 'worker'), [campaignsProcessor] as never);
    const subs = [];
    for (const e of locals) subs.push((await api('POST', '/subscribers', { email: `${e}@${domain}` }, o.token)).json());
    const c = (await api('POST', '/campaigns', { name: name.toLowerCase(), subject: 's', senderId: sid, content: `x${UNSUB_MD}` }, o.token)).json();
    await api('POST', `/campaigns/${c.id}/send`, {}, o.token);
    await waitFor(async () => (await sql<{ fanout_done: boolean }>('select fanout_done from campaigns where id = ?', [c.id]))[0]?.fanout_done);
    return { o, c, subs, fanOnly };
  }

  it('skips a recipient who unsubscribes during the fan-out and still completes', async () => {
    const { o, c, subs, fanOnly } = await fannedOutOnly('Edge', 'edge.test', ['x1', 'x2', 'x3', 'x4']);
    expect((await api('GET', `/campaigns/${c.id}`, undefined, o.token)).json().status).toBe('SENDING');
    await api('POST', `/subscribers/${subs[1].id}/unsubscribe`, {}, o.token);
    await fanOnly.close();
    const unsubscribedFailures = async () => (await ctx.services.metrics.emailsFailed.get()).values.find((v) => v.labels.reason === 'unsubscribed')?.value ?? 0;
    const before = await unsubscribedFailures();
    await startAllWorkers();
    const done = await waitFor(async () => {
      const got = (await api('GET', `/campaigns/${c.id}`, undefined, o.token)).json();
      return got.status === 'SENT' && got;
    });
    expect(done.emailsSentCount).toBe(3);
    const rows = await sql<{ to_address: string; status: string }>('select to_address, status from emails where campaign_id = ? order by to_address', [c.id]);
    expect(rows.map((r) => r.status)).toEqual(['sent', 'failed', 'sent', 'sent']);
    expect(sink.messages.some((m) => JSON.stringify(m.to).includes('x2@edge.test'))).toBe(false);
    // Counted where operators look (docs/operations.md): the worker gave the email up.
    expect(await unsubscribedFailures()).toBe(before + 1);
  });

  it('sends nothing to an address its contact left after the fan-out, even when another contact took it', async () => {
    const { o, c, subs, fanOnly } = await fannedOutOnly('Moves', 'moves.test', ['m1', 'm2']);
    // m1 moves away; a new contact, never in the campaign's audience at its fan-out, takes the address.
    expect((await api('PATCH', `/subscribers/${subs[0].id}`, { email: 'm1-new@moves.test' }, o.token)).statusCode).toBe(200);
    expect((await api('POST', '/subscribers', { email: 'm1@moves.test' }, o.token)).statusCode).toBe(200);
    await fanOnly.close();
    await startAllWorkers();
    const done = await waitFor(async () => {
      const got = (await api('GET', `/campaigns/${c.id}`, undefined, o.token)).json();
      return got.status === 'SENT' && got;
    });
    expect(done.emailsSentCount).toBe(1);
    const rows = await sql<{ to_address: string; status: string; failure_reason: string | null }>('select to_address, status, failure_reason from emails where campaign_id = ? order by to_address', [c.id]);
    expect(rows).toEqual([
      { to_address: 'm1@moves.test', status: 'failed', failure_reason: 'recipient no longer subscribed' },
      { to_address: 'm2@moves.test', status: 'sent', failure_reason: null },
    ]);
    expect(sink.messages.some((m) => JSON.stringify(m.to).includes('m1@moves.test'))).toBe(false);
  });

  it('deleting a SENDING campaign stops the rest', async () => {
    const o = await createOrg(ctx.services, { name: 'Stop' });
    const sid = await createSenderRow(ctx.services, o.organizationId, 'stop@stop.test');
    for (const e of ['y1', 'y2']) await api('POST', '/subscribers', { email: `${e}@stop.test` }, o.token);
    const c = (await api('POST', '/campaigns', { name: 'stop', subject: 's', senderId: sid, content: `x${UNSUB_MD}` }, o.token)).json();
    // Move it to SENDING with emails queued but not sent: no send worker for this org's mail.
    await workers?.close();
    workers = undefined;
    const fanOnly = await startWorkers(ctx.services, createRedis(ctx.env.config.redisUrl, 'worker'), [campaignsProcessor] as never);
    await api('POST', `/campaigns/${c.id}/send`, {}, o.token);
    await waitFor(async () => (await sql<{ fanout_done: boolean }>('select fanout_done from campaigns where id = ?', [c.id]))[0]?.fanout_done);
    expect((await api('DELETE', `/campaigns/${c.id}`, undefined, o.token)).json()).toEqual({ object: 'campaign', id: c.id, deleted: true });
    await fanOnly.close();
    await startAllWorkers();
    await new Promise((r) => setTimeout(r, 300));
    const rows = await sql<{ status: string; failure_reason: string }>('select status, failure_reason from emails where campaign_id = ?', [c.id]);
    expect(rows.map((r) => r.status)).toEqual(['failed', 'failed']);
    expect(sink.messages.some((m) => JSON.stringify(m.to).includes('@stop.test'))).toBe(false);
  });
});

describe('delete during the fan-out', () => {
  it('a page waits for a delete holding the campaign row, then writes nothing', async () => {
    const o = await createOrg(ctx.services, { name: 'Race' });
    const sid = await createSenderRow(ctx.services, o.organizationId, 'race@race.test');
    for (const e of ['r1', 'r2', 'r3']) await api('POST', '/subscribers', { email: `${e}@race.test` }, o.token);
    const c = (await api('POST', '/campaigns', { name: 'race', subject: 's', senderId: sid, content: `x${UNSUB_MD}` }, o.token)).json();
    await sql(`update campaigns set status = 'SENDING' where id = ?`, [c.id]);
    // Its template written already (as after a first page): the page's own statement waits.
    await sql(`insert into campaign_templates (campaign_id, subject, html, text) values (?, 's', '<p>x</p>', 'x')`, [c.id]);
    // The delete's transaction (service.deleteCampaign) holds the row while the fan-out starts.
    const client = new pg.Client({ connectionString: ctx.env.config.databaseUrl });
    await client.connect();
    try {
      await client.query('begin');
      await client.query('select id from campaigns where id = $1 for update', [c.id]);
      const deps = { producer: ctx.services.producer, logger: ctx.services.logger, pageSize: 2, now: () => new Date(), policy: ctx.services.config };
      const fanOut = runFanOut(ctx.services.orm.em.fork(), deps, c.id);
      await new Promise((r) => setTimeout(r, 300));
      await client.query(`update emails set status = 'failed' where campaign_id = $1 and status = 'queued'`, [c.id]);
      await client.query('delete from campaigns where id = $1', [c.id]);
      await client.query('commit');
      expect(await fanOut).toBe('gone');
    } finally {
      await client.end();
    }
    expect(await sql('select id from emails where campaign_id = ?', [c.id])).toEqual([]);
  });
});

describe('campaign email taken over from a dead worker', () => {
  it('is personalised again; once its campaign is deleted it fails instead of going out', async () => {
    const o = await createOrg(ctx.services, { name: 'Takeover' });
    const sid = await createSenderRow(ctx.services, o.organizationId, 'take@take.test');
    for (const e of ['z1', 'z2']) await api('POST', '/subscribers', { email: `${e}@take.test`, name: e.toUpperCase() }, o.token);
    const c = (await api('POST', '/campaigns', { name: 'take', subject: 'For {{name}}', senderId: sid, content: `Hi {{name}}${UNSUB_MD}` }, o.token)).json();
    // Fan-out only: the rows stay queued.
    await workers?.close();
    workers = undefined;
    const fanOnly = await startWorkers(ctx.services, createRedis(ctx.env.config.redisUrl, 'worker'), [campaignsProcessor] as never);
    await api('POST', `/campaigns/${c.id}/send`, {}, o.token);
    await waitFor(async () => (await sql<{ fanout_done: boolean }>('select fanout_done from campaigns where id = ?', [c.id]))[0]?.fanout_done);
    await fanOnly.close();
    const rows = await sql<{ id: string; to_address: string; content_kind: string }>('select id, to_address, content_kind from emails where campaign_id = ? order by to_address', [c.id]);
    expect(rows.map((r) => r.content_kind)).toEqual(['campaign', 'campaign']);
    // Both claimed by a worker that died before the hand-over.
    await sql(`update emails set status = 'sending', claimed_at = now() where campaign_id = ?`, [c.id]);
    const store = new DeliveryStore(ctx.services.orm, new HandoverFence(ctx.services.redis, ctx.env.config.redisPrefix), undefined, {
      signer: ctx.services.signer,
      publicUrl: ctx.env.config.publicUrl,
    });
    const first = await deliverEmail(store, ctx.services.mailer, rows[0]!.id, { finalAttempt: false });
    expect(first.outcome).toBe('sent');
    const mail = await waitFor(async () => sink.messages.find((m) => JSON.stringify(m.to).includes('z1@take.test')));
    expect(mail.subject).toBe('For Z1');
    expect(String(mail.html)).toContain('Hi Z1');
    expect(mail.headerLines.find((h) => h.key === 'list-unsubscribe')?.line).toMatch(/<http.*\/u\/.+>/);
    expect((await sql<{ subject: string }>('select subject from emails where id = ?', [rows[0]!.id]))[0]!.subject).toBe('For Z1');

    await api('DELETE', `/campaigns/${c.id}`, undefined, o.token);
    const second = await deliverEmail(store, ctx.services.mailer, rows[1]!.id, { finalAttempt: false });
    expect(second).toMatchObject({ outcome: 'failed' });
    expect((await sql<{ status: string }>('select status from emails where id = ?', [rows[1]!.id]))[0]!.status).toBe('failed');
    await new Promise((r) => setTimeout(r, 100));
    expect(sink.messages.some((m) => JSON.stringify(m.to).includes('z2@take.test'))).toBe(false);
  });
});

describe('reconciler (docs/campaigns.md "Fan-out")', () => {
  it('re-enqueues the job of a SCHEDULED campaign that Redis lost', async () => {
    await startAllWorkers();
    const c = await createCampaign({ content: `Hi${UNSUB_MD}` });
    await api('POST', `/campaigns/${c.id}/send`, { scheduledAt: '2032-01-01T00:00:00Z' });
    const queue = ctx.services.producer.queue('campaigns');
    await queue.remove(c.id);
    expect(await queue.getJob(c.id)).toBeUndefined();
    await ctx.services.producer.add('campaigns', { name: 'reconcile', data: {}, jobId: `reconcile-test-${c.id}` });
    const job = await waitFor(async () => queue.getJob(c.id)).catch(async (e) => {
      const r = await queue.getJob(`reconcile-test-${c.id}`);
      throw new Error(`${e}: reconcile job ${await r?.getState()} ${r?.failedReason} ${JSON.stringify(r?.returnvalue)}`);
    });
    expect(await job.getState()).toBe('delayed');
    // The delay is computed a few ms before BullMQ stamps the job: due within a second.
    const due = job.timestamp + (job.opts.delay ?? 0) - Date.parse('2032-01-01T00:00:00Z');
    expect(due).toBeGreaterThanOrEqual(0);
    expect(due).toBeLessThan(1_000);
  });

  it('resumes a SENDING campaign whose fan-out job was lost, and completes it', async () => {
    await startAllWorkers();
    const o = await createOrg(ctx.services, { name: 'Lost' });
    const sid = await createSenderRow(ctx.services, o.organizationId, 'lost@lost.test');
    for (const e of ['z1', 'z2', 'z3']) await api('POST', '/subscribers', { email: `${e}@lost.test` }, o.token);
    const c = (await api('POST', '/campaigns', { name: 'lost', subject: 's', senderId: sid, content: `x${UNSUB_MD}` }, o.token)).json();
    // As if Redis lost everything after the worker had started the campaign.
    await sql(`update campaigns set status = 'SENDING', send_at = now(), scheduled_at = now(), recipient_count = 3 where id = ?`, [c.id]);
    await ctx.services.producer.add('campaigns', { name: 'reconcile', data: {}, jobId: `reconcile-test-${c.id}` });
    const done = await waitFor(async () => {
      const got = (await api('GET', `/campaigns/${c.id}`, undefined, o.token)).json();
      return got.status === 'SENT' && got;
    });
    expect(done.emailsSentCount).toBe(3);
  });
});

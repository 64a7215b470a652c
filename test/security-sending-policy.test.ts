import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFanOut } from '../src/shared/campaigns/fanout.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { subscribersProcessor } from '../src/workers/subscribers.js';
import { createRedis, waitForRedis } from '../src/shared/redis.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { createSenderRow } from './helpers/campaigns.js';

/**
 * The sending policy (docs/security.md) with ALLOW_UNVERIFIED_DOMAINS=false: a domain added
 * without proof (here `paypal.com`) gives no path to mail From it.
 */
let ctx: TestContext;
let token: string;
let organizationId: string;

beforeAll(async () => {
  ctx = await createTestContext({ ALLOW_UNVERIFIED_DOMAINS: 'false', TEST_SENDS_PER_HOUR: '2', PUBLIC_URL: 'https://mail.example.test' });
  await waitForRedis(ctx.services.redis);
  ({ token, organizationId } = await createOrg(ctx.services, { doubleOptIn: true }));
});
afterAll(async () => ctx?.close());

const api = (method: 'GET' | 'POST' | 'PATCH', url: string, body?: unknown, auth = token) =>
  ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(auth), ...(body === undefined ? {} : { payload: body as object }) });

async function emailCount(): Promise<number> {
  const [row] = await ctx.services.orm.em.fork().execute<{ n: string }[]>('select count(*) as n from emails');
  return Number(row!.n);
}

async function campaignFrom(senderId: string): Promise<string> {
  const res = await api('POST', '/campaigns', {
    name: 'Security notice',
    subject: 'Your account',
    contentType: 'MARKDOWN',
    content: 'Log in [here](https://phish.example). [unsubscribe]({{unsubscribe_url}})',
    senderId,
  });
  expect(res.statusCode).toBe(200);
  return res.json().id;
}

describe('a domain the organization has not proven', () => {
  let paypalSender: string;

  beforeAll(async () => {
    expect((await api('POST', '/domains', { domain: 'paypal.com' })).statusCode).toBe(200);
    const sender = await api('POST', '/senders', { name: 'PayPal', email: 'service@paypal.com' });
    expect(sender.statusCode).toBe(200);
    paypalSender = sender.json().id;
  });

  it('cannot send a campaign', async () => {
    const id = await campaignFrom(paypalSender);
    const res = await api('POST', `/campaigns/${id}/send`, {});
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error' });
    expect(res.json().message).toContain('paypal.com');
    expect((await api('GET', `/campaigns/${id}`)).json().status).toBe('DRAFT');
  });

  it('is named for every item of a batch it refuses, with one message for each, and nothing is written', async () => {
    const before = await emailCount();
    const item = (from: string) => ({ from, to: 'r@example.net', subject: 'Hi', html: '<p>x</p>' });
    const res = await api('POST', '/emails/batch', [item('a@paypal.com'), item('b@paypal.com'), item('Evil <c@nope.test>')]);
    expect(res.statusCode).toBe(422);
    const paypal = 'the sending domain paypal.com is NOT_STARTED, not VERIFIED';
    expect(res.json()).toMatchObject({
      message: `0.from: ${paypal}`,
      details: [
        { path: '0.from', message: paypal },
        { path: '1.from', message: paypal },
        { path: '2.from', message: 'the sending domain nope.test is not a domain of this organization' },
      ],
    });
    expect(await emailCount()).toBe(before);
  });

  it('cannot send a campaign test email', async () => {
    const id = await campaignFrom(paypalSender);
    const before = await emailCount();
    const res = await api('POST', `/campaigns/${id}/test`, { to: 'victim@example.net' });
    expect(res.statusCode).toBe(422);
    expect(res.json().message).toContain('paypal.com');
    expect(await emailCount()).toBe(before);
  });

  it('is never the From of a double opt-in confirmation', async () => {
    const connection = createRedis(ctx.services.config.redisUrl, 'worker');
    let workers: RunningWorkers | undefined;
    try {
      workers = await startWorkers(ctx.services, connection, [subscribersProcessor]);
      const created = await api('POST', '/subscribers', { email: 'new-subscriber@example.net' });
      expect(created.statusCode).toBe(200);
      const deadline = Date.now() + 10_000;
      let from: string | undefined;
      while (!from && Date.now() < deadline) {
        const rows = await ctx.services.orm.em.fork().execute<{ from: string }[]>(`select from_address as "from" from emails where to_address = 'new-subscriber@example.net'`);
        from = rows[0]?.from;
        if (!from) await new Promise((r) => setTimeout(r, 50));
      }
      expect(from).toBeDefined();
      expect(from).not.toContain('paypal.com');
      expect(from).toContain('no-reply@mail.example.test');
    } finally {
      await workers?.close();
      connection.disconnect();
    }
  });
});

describe('campaign test sends', () => {
  let verifiedSender: string;

  beforeAll(async () => {
    verifiedSender = await createSenderRow(ctx.services, organizationId, 'news@acme.test');
  });

  it('need the send permission', async () => {
    const id = await campaignFrom(verifiedSender);
    const marketing = await api('POST', '/tokens', { name: 'marketing', preset: 'marketing' });
    expect(marketing.statusCode).toBe(200);
    const res = await api('POST', `/campaigns/${id}/test`, { to: 'me@example.net' }, marketing.json().token);
    expect(res.statusCode).toBe(403);
  });

  it('go to a limited number of recipients an hour per organization', async () => {
    const id = await campaignFrom(verifiedSender);
    const sent = [];
    for (const to of ['a@example.net', 'b@example.net', 'c@example.net']) sent.push(await api('POST', `/campaigns/${id}/test`, { to }));
    expect(sent.map((r) => r.statusCode)).toEqual([200, 200, 429]);
    expect(sent[2]!.json()).toMatchObject({ name: 'rate_limit_exceeded' });
    // This limit's own headers: when to retry, and its budget (not the per-second API limit's).
    const retryAfter = Number(sent[2]!.headers['retry-after']);
    expect(retryAfter).toBeGreaterThan(0);
    expect(retryAfter).toBeLessThanOrEqual(3_600);
    expect(sent[2]!.headers).toMatchObject({ 'ratelimit-limit': '2', 'ratelimit-remaining': '0', 'ratelimit-reset': String(retryAfter) });
    const rows = await ctx.services.orm.em.fork().execute<{ to: string }[]>(`select to_address as "to" from emails where source = 'test' order by to_address`);
    expect(rows.map((r) => r.to)).toEqual(['a@example.net', 'b@example.net']);
  });

  it('a campaign whose domain lost its verification fails at fan-out without writing a recipient', async () => {
    const senderId = await createSenderRow(ctx.services, organizationId, 'news@lapsed.test');
    await api('POST', '/subscribers', { email: 'reader@example.net' });
    const id = await campaignFrom(senderId);
    expect((await api('POST', `/campaigns/${id}/send`, {})).statusCode).toBe(200);
    await ctx.services.orm.em.fork().execute(`update domains set status = 'FAILED' where domain = 'lapsed.test'`);
    const deps = { producer: ctx.services.producer, logger: ctx.services.logger, pageSize: 10, now: () => new Date(), policy: ctx.services.config };
    expect(await runFanOut(ctx.services.orm.em.fork(), deps, id)).toBe('failed-no-sender');
    expect((await api('GET', `/campaigns/${id}`)).json().status).toBe('FAILED');
    const rows = await ctx.services.orm.em.fork().execute<{ n: string }[]>('select count(*) as n from emails where campaign_id = ?', [id]);
    expect(Number(rows[0]!.n)).toBe(0);
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { createSenderRow, seedSubscribers } from './helpers/campaigns.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { sample as sampleOf } from './helpers/ops-metrics.js';
import { until } from './helpers/until.js';

/**
 * Every counter of docs/operations.md moves when the code path it names runs: a real send
 * through the API and a worker (file transport), a real verification, real DNS lookups.
 * Nothing here increments a counter itself.
 */

let ctx: TestContext;
let dns: TestDnsServer;
let token: string;
let workers: RunningWorkers;
let connection: ReturnType<typeof createRedis>;

beforeAll(async () => {
  dns = await startDnsServer({
    'metricsmail.io': { mx: [{ priority: 10, exchange: 'mx.metricsmail.io' }], ttl: 300 },
    'mx.metricsmail.io': { a: ['192.0.2.10'], ttl: 300 },
    'lookups.example': { txt: ['hello'], ttl: 300 },
  });
  ctx = await createTestContext({ DNS_SERVERS: dns.address });
  ({ token } = await createOrg(ctx.services));
  connection = createRedis(ctx.env.config.redisUrl, 'worker');
  workers = await startWorkers(ctx.services, connection, [emailSendProcessor('emails', { reconcileGraceMs: 0 })]);
});
afterAll(async () => {
  await workers?.close();
  connection?.disconnect();
  await ctx?.close();
  await dns?.close();
});

/** The value of one sample of a Prometheus text body (0 when the series has no sample yet). */
const sample = (body: string, name: string, labels: Record<string, string> = {}): number => sampleOf(body, name, labels) ?? 0;

async function scrape(): Promise<string> {
  const res = await ctx.app.inject({ url: '/metrics' });
  expect(res.statusCode).toBe(200);
  return res.body;
}

const email = (to: string) => ({ from: 'App <app@sender.example>', to, subject: 'Hi', html: '<p>Hello</p>' });

describe('email counters follow a real send (file transport)', () => {
  it('accepted{source=api} on the API answer, then sent and delivered when the worker hands it over', async () => {
    const before = await scrape();
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: bearer(token), payload: email('one@example.com') });
    expect(res.statusCode, res.body).toBe(200);
    const batch = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/emails/batch',
      headers: bearer(token),
      payload: [email('two@example.com'), email('three@example.com')],
    });
    expect(batch.statusCode).toBe(200);
    const afterAccept = await scrape();
    expect(sample(afterAccept, 'mailroom_emails_accepted_total', { source: 'api' }) - sample(before, 'mailroom_emails_accepted_total', { source: 'api' })).toBe(3);

    const ids = [res.json().id, ...batch.json().data.map((d: { id: string }) => d.id)];
    await until(async () => {
      const events = await Promise.all(ids.map(async (id) => (await ctx.app.inject({ url: `/api/v2/emails/${id}`, headers: bearer(token) })).json().last_event));
      return events.every((e) => e === 'delivered');
    }, Boolean);
    const after = await scrape();
    const delta = (name: string, labels?: Record<string, string>) => sample(after, name, labels) - sample(before, name, labels);
    expect(delta('mailroom_emails_sent_total', { source: 'api' })).toBe(3);
    expect(delta('mailroom_emails_delivered_total')).toBe(3);
    expect(delta('mailroom_emails_failed_total')).toBe(0);
  });

  it('a replayed Idempotency-Key accepts nothing new', async () => {
    const headers = { ...bearer(token), 'idempotency-key': 'metrics-once' };
    const first = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers, payload: email('idem@example.com') });
    expect(first.statusCode).toBe(200);
    const between = await scrape();
    const again = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers, payload: email('idem@example.com') });
    expect(again.json().id).toBe(first.json().id);
    expect(sample(await scrape(), 'mailroom_emails_accepted_total', { source: 'api' })).toBe(sample(between, 'mailroom_emails_accepted_total', { source: 'api' }));
  });
});

describe('verification and DNS counters follow real checks and lookups', () => {
  it('verification_checks_total{result} counts each answered check', async () => {
    const before = await scrape();
    const answers = [];
    for (const address of ['jane@metricsmail.io', 'joe@metricsmail.io']) {
      const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/verify', headers: bearer(token), payload: { email: address } });
      expect(res.statusCode).toBe(200);
      answers.push(res.json().result as string);
    }
    const after = await scrape();
    for (const result of new Set(answers)) {
      const expected = answers.filter((a) => a === result).length;
      expect(sample(after, 'mailroom_verification_checks_total', { result }) - sample(before, 'mailroom_verification_checks_total', { result })).toBe(expected);
    }
    // The first check asked the DNS server for the domain's MX.
    expect(sample(after, 'mailroom_dns_cache_misses_total', { type: 'mx' })).toBeGreaterThan(sample(before, 'mailroom_dns_cache_misses_total', { type: 'mx' }));
  });

  it('a repeated lookup is a cache hit, a first one a miss that reaches the server', async () => {
    const before = await scrape();
    const served = dns.count('lookups.example', 'TXT');
    await ctx.services.dns.txt('lookups.example');
    await ctx.services.dns.txt('lookups.example');
    const after = await scrape();
    expect(dns.count('lookups.example', 'TXT') - served).toBe(1);
    expect(sample(after, 'mailroom_dns_cache_misses_total', { type: 'txt' }) - sample(before, 'mailroom_dns_cache_misses_total', { type: 'txt' })).toBe(1);
    expect(sample(after, 'mailroom_dns_cache_hits_total', { type: 'txt' }) - sample(before, 'mailroom_dns_cache_hits_total', { type: 'txt' })).toBe(1);
  });
});

describe('campaign counters follow a real campaign', () => {
  it('campaigns_finished_total{status=cancelled} counts a scheduled campaign that is deleted', async () => {
    const org = await createOrg(ctx.services, { name: 'Campaign metrics' });
    const senderId = await createSenderRow(ctx.services, org.organizationId, 'news@campaign-metrics.test');
    await seedSubscribers(ctx.services, org.organizationId, 2, { domain: 'example.com' });
    const campaigns = (method: 'POST' | 'DELETE', path: string, payload?: object) =>
      ctx.app.inject({ method, url: `/api/v2/campaigns${path}`, headers: bearer(org.token), ...(payload ? { payload } : {}) });
    const created = await campaigns('POST', '', { name: 'Later', subject: 'Hi', content: 'Hello\n\n[Unsubscribe]({{unsubscribe_url}})', contentType: 'MARKDOWN', senderId });
    expect(created.statusCode, created.body).toBe(200);
    const id = created.json().id as string;
    const scheduled = await campaigns('POST', `/${id}/send`, { scheduledAt: new Date(Date.now() + 86_400_000).toISOString() });
    expect(scheduled.statusCode, scheduled.body).toBe(200);
    const before = await scrape();
    expect((await campaigns('DELETE', `/${id}`)).statusCode).toBe(200);
    const after = await scrape();
    expect(sample(after, 'mailroom_campaigns_finished_total', { status: 'cancelled' }) - sample(before, 'mailroom_campaigns_finished_total', { status: 'cancelled' })).toBe(1);
  });
});

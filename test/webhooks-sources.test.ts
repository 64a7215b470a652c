import pg from 'pg';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { completeCampaign } from '../src/shared/campaigns/fanout.js';
import { applyDeliveryFeedback } from '../src/shared/outcomes/provider-events.js';
import { checkDomain } from '../src/shared/domains/verification.js';
import { newId } from '../src/shared/ids.js';
import { domainsProcessor } from '../src/workers/domains.js';
import { SUPPRESSED_REASON } from '../src/shared/emails/deliver.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { webhookProcessor } from '../src/workers/webhooks.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startTestWorkers, type TestWorkers } from './helpers/hooks-workers.js';
import { publishDomainRecords, startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { waitFor } from './helpers/outages.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';
import { startWebhookReceiver, type WebhookReceiver } from './helpers/webhook-receiver.js';

// The other sources of events: an SMTP relay's acceptance and refusal, domain checks and a
// campaign's completion.
let ctx: TestContext;
let dns: TestDnsServer;
let sink: SmtpSink;
let receiver: WebhookReceiver;
let token: string;
let organizationId: string;
let secret: string;
let workers: TestWorkers | undefined;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  dns = await startDnsServer();
  sink = await startSmtpSink();
  ctx = await createTestContext({ DNS_SERVERS: dns.address, MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url });
  ({ token, organizationId } = await createOrg(ctx.services));
  workers = await startTestWorkers(ctx, [
    webhookProcessor({ dispatchEveryMs: 200 }) as never,
    domainsProcessor as never,
    emailSendProcessor('emails', { reconcileGraceMs: 0 }) as never,
  ]);
  const created = await api('POST', '/webhooks', { url: `${receiver.url}/ok`, events: ['*'] });
  secret = created.json().secret;
});
afterAll(async () => {
  await workers?.close();
  await ctx?.close();
  await sink?.close();
  await dns?.close();
  await receiver?.close();
});

function api(method: 'GET' | 'POST', url: string, payload?: unknown) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(token), ...(payload === undefined ? {} : { payload: payload as object }) });
}

function events(type: string) {
  return receiver.at('/ok').map((d) => new Webhook(secret).verify(d.body, d.headers as Record<string, string>) as { type: string; data: Record<string, unknown> }).filter((e) => e.type === type);
}

const eventFor = (type: string, match: (data: Record<string, unknown>) => boolean) => waitFor(type, () => events(type).find((e) => match(e.data)), 15_000);

describe('event sources', () => {
  it('email.sent when the relay accepts (no email.delivered yet); email.failed with the reason when it refuses', async () => {
    sink.answer = (rcpt) => (rcpt === 'nobody@example.org' ? { code: 550, message: '5.1.1 no such user' } : undefined);
    const ok = (await api('POST', '/emails', { from: 'a@acme.test', to: 'reader@example.org', subject: 'Hi', markdown: 'x' })).json().id as string;
    const refused = (await api('POST', '/emails', { from: 'a@acme.test', to: 'nobody@example.org', subject: 'Hi', markdown: 'x' })).json().id as string;
    await eventFor('email.sent', (d) => d.email_id === ok);
    const failed = await eventFor('email.failed', (d) => d.email_id === refused);
    expect(String(failed.data.reason)).toMatch(/550/);
    expect(events('email.sent').filter((e) => e.data.email_id === refused)).toHaveLength(0);
    await new Promise((r) => setTimeout(r, 500));
    expect(events('email.delivered').filter((e) => e.data.email_id === ok)).toHaveLength(0);
  });

  it('email.failed with the reason when the claim finds the recipient suppressed', async () => {
    await ctx.services.orm.em.fork().execute(`insert into suppressions (organization_id, address, reason) values (?, 'gone@example.org', 'hard_bounce')`, [organizationId]);
    const id = (await api('POST', '/emails', { from: 'a@acme.test', to: 'gone@example.org', subject: 'Hi', markdown: 'x' })).json().id as string;
    const failed = await eventFor('email.failed', (d) => d.email_id === id);
    expect(failed.data).toMatchObject({ to: ['gone@example.org'], subject: 'Hi', reason: SUPPRESSED_REASON });
    expect(sink.envelopes.some((to) => to.includes('gone@example.org'))).toBe(false);
  });

  it('email.delivery_delayed and email.complained from delivery feedback, once each however often reported', async () => {
    const id = (await api('POST', '/emails', { from: 'a@acme.test', to: 'later@example.org', subject: 'Hi', markdown: 'x' })).json().id as string;
    const sent = await eventFor('email.sent', (d) => d.email_id === id);
    const messageId = String(sent.data.message_id);
    for (let i = 0; i < 2; i++) {
      await applyDeliveryFeedback(ctx.services.orm.em.fork(), { type: 'delivery_delayed', messageId, diagnostic: '451 4.2.0 try later' }, { now: new Date() });
      await applyDeliveryFeedback(ctx.services.orm.em.fork(), { type: 'complained', messageId }, { now: new Date() });
    }
    await eventFor('email.delivery_delayed', (d) => d.email_id === id);
    await eventFor('email.complained', (d) => d.email_id === id);
    await new Promise((r) => setTimeout(r, 500));
    expect(events('email.delivery_delayed').filter((e) => e.data.email_id === id)).toHaveLength(1);
    expect(events('email.complained').filter((e) => e.data.email_id === id)).toHaveLength(1);
  });

  it('contact.updated when delivery feedback marks a subscriber BOUNCED, then COMPLAINED; nothing for a repeat', async () => {
    const created = await api('POST', '/subscribers', { email: 'reader@bounce.example', name: 'Reader', tags: ['vip'], fields: { plan: 'pro' } });
    expect(created.statusCode).toBe(200);
    const subscriberId = created.json().id as string;
    const updates = () => events('contact.updated').filter((e) => e.data.id === subscriberId);
    const id = (await api('POST', '/emails', { from: 'a@acme.test', to: 'reader@bounce.example', subject: 'Hi', markdown: 'x' })).json().id as string;
    const messageId = String((await eventFor('email.sent', (d) => d.email_id === id)).data.message_id);
    const feedback = (type: 'bounced' | 'complained') => applyDeliveryFeedback(ctx.services.orm.em.fork(), { type, bounceType: 'hard', messageId }, { now: new Date() });

    await feedback('bounced');
    await feedback('bounced');
    const bounced = await waitFor('contact.updated BOUNCED', () => updates().find((e) => e.data.status === 'BOUNCED'), 15_000);
    expect(bounced.data).toEqual({ id: subscriberId, email: 'reader@bounce.example', name: 'Reader', phone: null, status: 'BOUNCED', tags: [{ id: expect.stringMatching(/^tag_/), name: 'vip' }], fields: { plan: 'pro' } });
    await feedback('complained');
    await waitFor('contact.updated COMPLAINED', () => updates().find((e) => e.data.status === 'COMPLAINED'), 15_000);
    await feedback('complained');
    // The outbox itself, not what was delivered by now: one row a change, none for the repeats.
    const [{ n }] = await ctx.services.orm.em
      .fork()
      .execute<{ n: number }[]>(`select count(*)::int as n from webhook_messages where type = 'contact.updated' and payload -> 'data' ->> 'id' = ?`, [subscriberId]);
    expect(n).toBe(2);
    expect(updates().map((e) => e.data.status)).toEqual(['BOUNCED', 'COMPLAINED']);
  });

  it('domain.verified when its records are found, domain.failed after 72 hours without them', async () => {
    const created = (await api('POST', '/domains', { domain: 'news.example' })).json();
    publishDomainRecords(dns, created.dnsRecords);
    expect((await api('POST', `/domains/${created.domain}/verify`)).statusCode).toBe(200);
    const verified = await eventFor('domain.verified', (d) => d.id === created.id);
    expect(verified.data).toMatchObject({ domain: 'news.example', status: 'VERIFIED' });

    const other = (await api('POST', '/domains', { domain: 'never.example' })).json();
    expect((await api('POST', `/domains/${other.domain}/verify`)).statusCode).toBe(200);
    await waitFor('first check', async () => (await api('GET', `/domains/${other.id}`)).json().message);
    await ctx.services.orm.em.fork().execute(`update domains set pending_since = now() - interval '73 hours' where id = ?`, [other.id]);
    const checked = await checkDomain(ctx.services.orm.em.fork(), ctx.services.dns.fresh, other.id);
    expect(checked?.status).toBe('FAILED');
    const failed = await eventFor('domain.failed', (d) => d.id === other.id);
    expect(failed.data).toMatchObject({ domain: 'never.example', status: 'FAILED' });
    expect(events('domain.verified').filter((e) => e.data.id === other.id)).toHaveLength(0);
  });

  it('domain.verified once for checks of one domain at once, and none for a domain deleted during its check', async () => {
    const outbox = async (domainId: string) =>
      (await ctx.services.orm.em.fork().execute<{ n: number }[]>(`select count(*)::int as n from webhook_messages where type = 'domain.verified' and payload -> 'data' ->> 'id' = ?`, [domainId]))[0]!.n;
    const pending = async (name: string) => {
      const created = (await api('POST', '/domains', { domain: name })).json();
      publishDomainRecords(dns, created.dnsRecords);
      await ctx.services.orm.em.fork().execute(`update domains set status = 'PENDING', pending_since = now() where id = ?`, [created.id]);
      return created.id as string;
    };

    const twice = await pending('twice.example');
    const checks = await Promise.all(Array.from({ length: 5 }, () => checkDomain(ctx.services.orm.em.fork(), ctx.services.dns.fresh, twice)));
    expect(checks.map((d) => d?.status)).toEqual(Array(5).fill('VERIFIED'));
    expect(await outbox(twice)).toBe(1);

    // The delete holds the row while the check looks its records up, then commits.
    const gone = await pending('gone.example');
    const client = new pg.Client({ connectionString: ctx.env.config.databaseUrl });
    await client.connect();
    try {
      await client.query('begin');
      await client.query('delete from domains where id = $1', [gone]);
      const check = checkDomain(ctx.services.orm.em.fork(), ctx.services.dns.fresh, gone);
      await new Promise((resolve) => setTimeout(resolve, 300));
      await client.query('commit');
      expect(await check).toBeNull();
    } finally {
      await client.end();
    }
    expect(await outbox(gone)).toBe(0);
  });

  it('campaign.sent when a campaign completes', async () => {
    const id = newId('cmp');
    await ctx.services.orm.em.fork().execute(
      `insert into campaigns (id, organization_id, name, subject, status, recipient_count, fanout_done, created_at, updated_at)
       values (?, ?, 'November', 'News', 'SENDING', 0, true, now(), now())`,
      [id, organizationId],
    );
    expect(await completeCampaign(ctx.services.orm.em.fork(), undefined, id)).toBe('SENT');
    const sent = await eventFor('campaign.sent', (d) => d.campaign_id === id);
    expect(sent.data).toMatchObject({ name: 'November', subject: 'News', recipient_count: 0, emails_sent_count: 0 });
    expect(sent.data.finished_at).toMatch(/Z$/);
    // Completing again changes nothing and writes no second event.
    expect(await completeCampaign(ctx.services.orm.em.fork(), undefined, id)).toBe('gone');
    await new Promise((r) => setTimeout(r, 500));
    expect(events('campaign.sent').filter((e) => e.data.campaign_id === id)).toHaveLength(1);
  });
});

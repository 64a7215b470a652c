import { createHmac } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createToken } from '../src/shared/tokens/service.js';
import { clickToken, openToken } from '../src/shared/outcomes/tokens.js';
import { PURGE_TARGETS, purgeExpired } from '../src/shared/retention/purge.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { webhookProcessor } from '../src/workers/webhooks.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startTestWorkers, type TestWorkers } from './helpers/hooks-workers.js';
import { waitFor } from './helpers/outages.js';
import { startWebhookReceiver, type ReceivedWebhook, type WebhookReceiver } from './helpers/webhook-receiver.js';

const PROVIDER_SECRET = 'provider-secret';

let ctx: TestContext;
let receiver: WebhookReceiver;
let token: string;
let organizationId: string;
let workers: TestWorkers | undefined;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  ctx = await createTestContext({ PROVIDER_WEBHOOK_SECRET: PROVIDER_SECRET, PUBLIC_URL: 'http://mailroom.test' });
  ({ token, organizationId } = await createOrg(ctx.services));
  workers = await startTestWorkers(ctx, [
    webhookProcessor({ dispatchEveryMs: 200 }) as never,
    emailSendProcessor('emails', { reconcileGraceMs: 0 }) as never,
  ]);
});
afterAll(async () => {
  await workers?.close();
  await ctx?.close();
  await receiver?.close();
});

const sql = <T = Record<string, unknown>>(query: string, params: unknown[] = []) => ctx.services.orm.em.fork().execute<T[]>(query, params, 'all');

async function api(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: unknown, auth = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(auth), ...(payload === undefined ? {} : { payload: payload as object }) });
}

async function createEndpoint(path: string, events: string[] = ['*']) {
  const response = await api('POST', '/webhooks', { url: `${receiver.url}${path}`, events });
  expect(response.statusCode).toBe(200);
  return response.json() as { id: string; secret: string; url: string };
}

/** The verified payload of a delivery, as a receiver using the standardwebhooks library reads it. */
function verified(secret: string, delivery: ReceivedWebhook) {
  const headers = {
    'webhook-id': String(delivery.headers['webhook-id']),
    'webhook-timestamp': String(delivery.headers['webhook-timestamp']),
    'webhook-signature': String(delivery.headers['webhook-signature']),
  };
  return new Webhook(secret).verify(delivery.body, headers) as { type: string; created_at: string; data: Record<string, unknown> };
}

async function eventOf(path: string, secret: string, type: string, match: (data: Record<string, unknown>) => boolean = () => true) {
  return waitFor(`${type} at ${path}`, () => {
    for (const delivery of receiver.at(path)) {
      let event: ReturnType<typeof verified>;
      try {
        event = verified(secret, delivery);
      } catch {
        continue; // another endpoint's delivery to the same path
      }
      if (event.type === type && match(event.data)) return { event, delivery };
    }
    return undefined;
  }, 15_000);
}

describe('webhook endpoints API', () => {
  it('creates an endpoint with its secret shown once, lists, gets, updates, rotates and deletes it', async () => {
    const created = await api('POST', '/webhooks', { url: `${receiver.url}/ok`, events: ['email.sent', 'contact.created'], description: 'crm' });
    expect(created.statusCode).toBe(200);
    const body = created.json();
    expect(body).toMatchObject({ url: `${receiver.url}/ok`, events: ['email.sent', 'contact.created'], description: 'crm', enabled: true });
    expect(body.id).toMatch(/^whk_[0-9a-z]{26}$/);
    expect(body.secret).toMatch(/^whsec_[A-Za-z0-9+/]+=*$/);
    const bytes = Buffer.from(body.secret.slice(6), 'base64').length;
    expect(bytes).toBeGreaterThanOrEqual(24);
    expect(bytes).toBeLessThanOrEqual(64);
    expect(body.createdAt).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);

    const listed = await api('GET', '/webhooks');
    expect(listed.statusCode).toBe(200);
    const item = listed.json().data.find((w: { id: string }) => w.id === body.id);
    expect(item).toBeDefined();
    expect(item.secret).toBeUndefined();
    expect(JSON.stringify(listed.json())).not.toContain(body.secret);
    // Its id is a cursor: older endpoints only.
    const older = await api('GET', `/webhooks?after=${body.id}`);
    expect(older.statusCode).toBe(200);
    expect(older.json().data.map((w: { id: string }) => w.id)).not.toContain(body.id);

    const got = await api('GET', `/webhooks/${body.id}`);
    expect(got.json()).toMatchObject({ id: body.id, events: ['email.sent', 'contact.created'] });
    expect(got.json().secret).toBeUndefined();

    const patched = await api('PATCH', `/webhooks/${body.id}`, { events: ['*'], description: null, enabled: false });
    expect(patched.statusCode).toBe(200);
    expect(patched.json()).toMatchObject({ events: ['*'], description: null, enabled: false, disabledReason: 'disabled by the user' });
    const enabled = await api('PATCH', `/webhooks/${body.id}`, { enabled: true });
    expect(enabled.json()).toMatchObject({ enabled: true, disabledReason: null });

    const rotated = await api('POST', `/webhooks/${body.id}/secret`);
    expect(rotated.statusCode).toBe(200);
    expect(rotated.json().secret).toMatch(/^whsec_/);
    expect(rotated.json().secret).not.toBe(body.secret);

    const deleted = await api('DELETE', `/webhooks/${body.id}`);
    expect(deleted.json()).toEqual({ object: 'webhook', id: body.id, deleted: true });
    expect((await api('GET', `/webhooks/${body.id}`)).statusCode).toBe(404);
    expect((await api('DELETE', `/webhooks/${body.id}`)).statusCode).toBe(404);
    // A cursor that is no endpoint of the organization (deleted, or no id at all) is 422, as for emails.
    for (const cursor of [body.id, 'whk_bogus']) {
      const unknown = await api('GET', `/webhooks?after=${cursor}`);
      expect(unknown.statusCode, cursor).toBe(422);
      expect(unknown.json().details[0]).toMatchObject({ path: 'after' });
    }
  });

  it('refuses bad input with 422 naming the field, and writes nothing', async () => {
    const before = await sql<{ n: number }>('select count(*)::int as n from webhook_endpoints');
    const unknown = await api('POST', '/webhooks', { url: `${receiver.url}/ok`, events: ['email.sent', 'email.exploded'] });
    expect(unknown.statusCode).toBe(422);
    expect(unknown.json().name).toBe('validation_error');
    expect(JSON.stringify(unknown.json().details)).toContain('email.exploded');
    expect(unknown.json().details[0].path).toMatch(/^events/);

    const ftp = await api('POST', '/webhooks', { url: 'ftp://example.com/hook', events: ['*'] });
    expect(ftp.statusCode).toBe(422);
    expect(ftp.json().details[0].path).toBe('url');

    const credentials = await api('POST', '/webhooks', { url: 'https://user:secret@example.com/hook', events: ['*'] });
    expect(credentials.statusCode).toBe(422);
    expect(credentials.json().details[0]).toMatchObject({ path: 'url', message: expect.stringMatching(/user name or password/) });

    const empty = await api('POST', '/webhooks', { url: `${receiver.url}/ok`, events: [] });
    expect(empty.statusCode).toBe(422);
    expect(empty.json().details[0].path).toBe('events');

    const extra = await api('POST', '/webhooks', { url: `${receiver.url}/ok`, events: ['*'], secret: 'mine' });
    expect(extra.statusCode).toBe(422);

    const after = await sql<{ n: number }>('select count(*)::int as n from webhook_endpoints');
    expect(after[0]!.n).toBe(before[0]!.n);
  });

  it('needs the settings permission, and hides other organizations’ endpoints', async () => {
    const limited = await createToken(ctx.services.orm.em.fork(), ctx.services.box, { organizationId, tokenId: 'x', permissions: ['*'] }, { name: 'emails only', permissions: ['emails'] });
    expect((await api('GET', '/webhooks', undefined, limited.token)).statusCode).toBe(403);
    expect((await api('POST', '/webhooks', { url: `${receiver.url}/ok`, events: ['*'] }, limited.token)).statusCode).toBe(403);

    const mine = await createEndpoint('/ok', ['domain.verified']);
    const other = await createOrg(ctx.services, { name: 'Other' });
    expect((await api('GET', `/webhooks/${mine.id}`, undefined, other.token)).statusCode).toBe(404);
    expect((await api('PATCH', `/webhooks/${mine.id}`, { enabled: false }, other.token)).statusCode).toBe(404);
    expect((await api('GET', `/webhooks/${mine.id}/deliveries`, undefined, other.token)).statusCode).toBe(404);
    expect((await api('DELETE', `/webhooks/${mine.id}`, undefined, other.token)).statusCode).toBe(404);
    expect((await api('GET', '/webhooks', undefined, other.token)).json().data).toEqual([]);
    await api('DELETE', `/webhooks/${mine.id}`);
  });

  it('pages deliveries newest first with after and before; both cursors, or an unknown one, are 422 naming it', async () => {
    const endpoint = await createEndpoint('/ok');
    // Disabled: the messages stay pending and are only listed.
    expect((await api('PATCH', `/webhooks/${endpoint.id}`, { enabled: false })).statusCode).toBe(200);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await api('POST', `/webhooks/${endpoint.id}/test`)).json().id as string);
    const [newest, middle, oldest] = [...ids].reverse() as [string, string, string];
    const page = async (query: string) => {
      const response = await api('GET', `/webhooks/${endpoint.id}/deliveries?${query}`);
      expect(response.statusCode, query).toBe(200);
      const body = response.json() as { has_more: boolean; data: { id: string }[] };
      return { ids: body.data.map((d) => d.id), hasMore: body.has_more };
    };
    expect(await page('limit=2')).toEqual({ ids: [newest, middle], hasMore: true });
    expect(await page(`limit=2&after=${middle}`)).toEqual({ ids: [oldest], hasMore: false });
    expect(await page(`limit=1&before=${oldest}`)).toEqual({ ids: [middle], hasMore: true });
    expect(await page(`limit=2&before=${middle}`)).toEqual({ ids: [newest], hasMore: false });

    const both = await api('GET', `/webhooks/${endpoint.id}/deliveries?after=${oldest}&before=${newest}`);
    expect(both.statusCode).toBe(422);
    expect(both.json().details[0].path).toBe('after');
    const other = await createEndpoint('/ok');
    const foreign = (await api('POST', `/webhooks/${other.id}/test`)).json().id as string;
    for (const [field, cursor] of [['after', 'msg_00000000000000000000000000'], ['before', foreign], ['after', 'nonsense']] as const) {
      const unknown = await api('GET', `/webhooks/${endpoint.id}/deliveries?${field}=${cursor}`);
      expect(unknown.statusCode, `${field}=${cursor}`).toBe(422);
      expect(unknown.json().name).toBe('validation_error');
      expect(unknown.json().details[0].path).toBe(field);
    }
    await api('DELETE', `/webhooks/${endpoint.id}`);
    await api('DELETE', `/webhooks/${other.id}`);
  });

  it('answers 404 to a rotation or a patch of an endpoint that is not the caller’s, and changes nothing', async () => {
    const mine = await createEndpoint('/ok', ['domain.verified']);
    const other = await createOrg(ctx.services, { name: 'Other rotations' });
    const [before] = await sql<{ secret_sealed: string; url: string; description: string | null }>('select secret_sealed, url, description from webhook_endpoints where id = ?', [mine.id]);
    expect((await api('POST', `/webhooks/${mine.id}/secret`, undefined, other.token)).statusCode).toBe(404);
    expect((await api('PATCH', `/webhooks/${mine.id}`, { url: `${receiver.url}/elsewhere` }, other.token)).statusCode).toBe(404);
    expect((await api('PATCH', `/webhooks/${mine.id}`, { description: 'not mine' }, other.token)).statusCode).toBe(404);
    for (const id of ['whk_nope', 'not-an-id']) {
      expect((await api('POST', `/webhooks/${id}/secret`)).statusCode, id).toBe(404);
      expect((await api('PATCH', `/webhooks/${id}`, { description: 'x' })).statusCode, id).toBe(404);
    }
    const [after] = await sql<{ secret_sealed: string; url: string; description: string | null }>('select secret_sealed, url, description from webhook_endpoints where id = ?', [mine.id]);
    expect(after).toEqual(before);
    await api('DELETE', `/webhooks/${mine.id}`);
  });
});

describe('OpenAPI and tools', () => {
  it('documents the endpoints in the OpenAPI document and serves them as tools', async () => {
    const doc = (await ctx.app.inject({ url: '/api/v2/openapi.json' })).json();
    for (const path of ['/api/v2/webhooks', '/api/v2/webhooks/{id}', '/api/v2/webhooks/{id}/secret', '/api/v2/webhooks/{id}/deliveries', '/api/v2/webhooks/{id}/deliveries/{msgId}/retry', '/api/v2/webhooks/{id}/test']) {
      expect(doc.paths[path], path).toBeDefined();
    }
    expect(JSON.stringify(doc.paths['/api/v2/webhooks'].post)).toContain('email.delivery_delayed');

    const tool = (name: string, args: object) => ctx.app.inject({ method: 'POST', url: `/api/v2/tools/${name}`, headers: bearer(token), payload: { arguments: args } });
    const created = await tool('create_webhook', { url: `${receiver.url}/ok`, events: ['campaign.sent'] });
    expect(created.statusCode).toBe(200);
    expect(created.json().secret).toMatch(/^whsec_/);
    const bad = await tool('create_webhook', { url: `${receiver.url}/ok`, events: ['nope'] });
    expect(bad.statusCode).toBe(422);
    const sent = await tool('send_test_webhook', { webhookId: created.json().id });
    expect(sent.json()).toMatchObject({ type: 'webhook.test', status: 'pending' });
    const deliveries = await tool('list_webhook_deliveries', { webhookId: created.json().id, limit: 5 });
    expect(deliveries.json().data[0].id).toBe(sent.json().id);
    const listed = await tool('list_webhooks', {});
    expect(listed.json().data.map((w: { id: string }) => w.id)).toContain(created.json().id);
    await api('DELETE', `/webhooks/${created.json().id}`);
  });
});

describe('events from real actions', () => {
  it('delivers email, contact events, signed so that standardwebhooks verifies them', async () => {
    const endpoint = await createEndpoint('/ok', ['*']);
    // Subscribed to one type only: gets that and nothing else.
    const narrow = await createEndpoint('/status/200', ['contact.created']);

    const sent = await api('POST', '/emails', { from: 'Acme <news@acme.test>', to: 'jane@example.com', subject: 'Hi', html: '<p>Hello <a href="https://acme.test/x">x</a></p>', tags: [{ name: 'kind', value: 'welcome' }] });
    expect(sent.statusCode).toBe(200);
    const emailId = sent.json().id as string;

    const sentEvent = await eventOf('/ok', endpoint.secret, 'email.sent', (d) => d.email_id === emailId);
    expect(sentEvent.event.data).toMatchObject({
      email_id: emailId,
      from: 'Acme <news@acme.test>',
      to: ['jane@example.com'],
      subject: 'Hi',
      tags: [{ name: 'kind', value: 'welcome' }],
    });
    expect(sentEvent.event.data.message_id).toMatch(new RegExp(`^${emailId}@acme\\.test$`));
    expect(sentEvent.event.created_at).toMatch(/Z$/);
    expect(sentEvent.delivery.headers['webhook-id']).toMatch(/^msg_[0-9a-z]{26}$/);
    expect(sentEvent.delivery.headers['content-type']).toBe('application/json');
    await eventOf('/ok', endpoint.secret, 'email.delivered', (d) => d.email_id === emailId);

    // Opened and clicked through the public tracking endpoints.
    const { signer } = ctx.services;
    expect((await ctx.app.inject({ url: `/t/o/${openToken(signer, emailId)}.gif` })).statusCode).toBe(200);
    await eventOf('/ok', endpoint.secret, 'email.opened', (d) => d.email_id === emailId);
    const click = await ctx.app.inject({ url: `/t/c/${clickToken(signer, emailId, 0, 'https://acme.test/x')}` });
    expect(click.statusCode).toBe(302);
    const clicked = await eventOf('/ok', endpoint.secret, 'email.clicked', (d) => d.email_id === emailId);
    expect(clicked.event.data.click).toEqual({ url: 'https://acme.test/x' });

    // A bounce reported by the provider.
    const messageId = sentEvent.event.data.message_id as string;
    const raw = JSON.stringify({ type: 'bounced', messageId, bounceType: 'hard', diagnostic: '550 5.1.1 user unknown' });
    const bounce = await ctx.app.inject({
      method: 'POST',
      url: '/webhooks/provider',
      headers: { 'content-type': 'application/json', 'x-mailroom-signature': `sha256=${createHmac('sha256', PROVIDER_SECRET).update(raw).digest('hex')}` },
      payload: raw,
    });
    expect(bounce.statusCode).toBe(200);
    const bounced = await eventOf('/ok', endpoint.secret, 'email.bounced', (d) => d.email_id === emailId);
    expect(bounced.event.data.bounce).toEqual({ type: 'hard', diagnostic: '550 5.1.1 user unknown' });

    // Contacts.
    const created = await api('POST', '/subscribers', { email: 'lee@example.com', name: 'Lee' });
    expect(created.statusCode).toBe(200);
    const subscriberId = created.json().id as string;
    const contact = await eventOf('/ok', endpoint.secret, 'contact.created', (d) => d.id === subscriberId);
    expect(contact.event.data).toMatchObject({ id: subscriberId, email: 'lee@example.com', name: 'Lee', status: 'SUBSCRIBED', tags: [], fields: {} });
    expect((await api('POST', `/subscribers/${subscriberId}/unsubscribe`)).statusCode).toBe(200);
    const unsubscribed = await eventOf('/ok', endpoint.secret, 'contact.unsubscribed', (d) => d.id === subscriberId);
    expect(unsubscribed.event.data.status).toBe('UNSUBSCRIBED');
    await eventOf('/status/200', narrow.secret, 'contact.created', (d) => d.id === subscriberId);

    // The narrow endpoint got only what it subscribed to; every event once per endpoint.
    const types = receiver.at('/status/200').map((d) => verified(narrow.secret, d).type);
    expect(new Set(types)).toEqual(new Set(['contact.created']));
    const ids = receiver.at('/ok').map((d) => d.headers['webhook-id']);
    expect(new Set(ids).size).toBe(ids.length);

    // A signature made with another secret does not verify.
    expect(() => new Webhook(narrow.secret).verify(sentEvent.delivery.body, sentEvent.delivery.headers as Record<string, string>)).toThrow();
    await api('DELETE', `/webhooks/${endpoint.id}`);
    await api('DELETE', `/webhooks/${narrow.id}`);
  });

  it('sends email.bounced again when a hard bounce follows a soft one (the address is suppressed from then on); a replay sends nothing', async () => {
    const endpoint = await createEndpoint('/ok', ['email.bounced']);
    const sent = await api('POST', '/emails', { from: 'Acme <news@acme.test>', to: 'later-gone@example.com', subject: 'Hi', html: '<p>Hello</p>' });
    const emailId = sent.json().id as string;
    const messageId = await waitFor('its Message-ID', async () => (await sql<{ message_id: string | null }>('select message_id from emails where id = ?', [emailId]))[0]?.message_id ?? undefined, 15_000);
    const report = (bounceType: string, diagnostic: string) => {
      const raw = JSON.stringify({ type: 'bounced', messageId, bounceType, diagnostic });
      return ctx.app.inject({
        method: 'POST',
        url: '/webhooks/provider',
        headers: { 'content-type': 'application/json', 'x-mailroom-signature': `sha256=${createHmac('sha256', PROVIDER_SECRET).update(raw).digest('hex')}` },
        payload: raw,
      });
    };
    expect((await report('soft', '452 4.2.2 mailbox full')).statusCode).toBe(200);
    await eventOf('/ok', endpoint.secret, 'email.bounced', (d) => d.email_id === emailId && (d.bounce as { type: string }).type === 'soft');
    expect((await report('hard', '550 5.1.1 user unknown')).statusCode).toBe(200);
    const hard = await eventOf('/ok', endpoint.secret, 'email.bounced', (d) => d.email_id === emailId && (d.bounce as { type: string }).type === 'hard');
    expect(hard.event.data.bounce).toEqual({ type: 'hard', diagnostic: '550 5.1.1 user unknown' });
    // The email's event says hard now, and the address is suppressed.
    expect(await sql(`select details->>'bounceType' as type from email_events where email_id = ? and type = 'bounced'`, [emailId])).toEqual([{ type: 'hard' }]);
    expect(await sql(`select reason from suppressions where address = 'later-gone@example.com'`)).toEqual([{ reason: 'hard_bounce' }]);
    // Replays of either, and a soft bounce after the hard one, are not news.
    for (const [type, diagnostic] of [['hard', '550 5.1.1 user unknown'], ['soft', '452 4.2.2 mailbox full']] as const) expect((await report(type, diagnostic)).statusCode).toBe(200);
    const [{ n }] = await sql<{ n: number }>(`select count(*)::int as n from webhook_messages where endpoint_id = ? and type = 'email.bounced'`, [endpoint.id]);
    expect(n).toBe(2);
    await api('DELETE', `/webhooks/${endpoint.id}`);
  });

  it('writes nothing for an organization without endpoints, and nothing when the change rolls back', async () => {
    const before = await sql<{ n: number }>('select count(*)::int as n from webhook_messages');
    const other = await createOrg(ctx.services, { name: 'No hooks' });
    const created = await api('POST', '/subscribers', { email: 'solo@example.com' }, other.token);
    expect(created.statusCode).toBe(200);
    // A write refused halfway (the address is taken): its transaction, and any event, rolls back.
    const endpoint = await createEndpoint('/ok', ['contact.updated']);
    await api('POST', '/subscribers', { email: 'taken@example.com' });
    await api('POST', '/subscribers', { email: 'mover@example.com' });
    const refused = await api('PATCH', '/subscribers/mover@example.com', { email: 'taken@example.com', name: 'Changed' });
    expect(refused.statusCode).toBe(422);
    const after = await sql<{ n: number }>(`select count(*)::int as n from webhook_messages where type = 'contact.updated'`);
    expect(after[0]!.n).toBe(0);
    const all = await sql<{ n: number }>('select count(*)::int as n from webhook_messages');
    expect(all[0]!.n).toBe(before[0]!.n);
    await api('DELETE', `/webhooks/${endpoint.id}`);
  });
});

describe('delivery', () => {
  it('retries a failing receiver with the same webhook-id on the schedule, and lists the attempts', async () => {
    const endpoint = await createEndpoint('/fail-twice', ['contact.created']);
    const test = await api('POST', `/webhooks/${endpoint.id}/test`);
    expect(test.statusCode).toBe(200);
    const msgId = test.json().id as string;
    expect(test.json()).toMatchObject({ id: msgId, type: 'webhook.test', status: 'pending', attempts: 0 });

    const attempt = async (n: number) => {
      const row = await waitFor(`attempt ${n}`, async () => {
        const [r] = await sql<{ attempts: number; status: string; last_status_code: number | null; next_attempt_at: Date | null; updated_at: Date }>(
          'select attempts, status, last_status_code, next_attempt_at, updated_at from webhook_messages where id = ?',
          [msgId],
        );
        return r && r.attempts >= n ? r : undefined;
      }, 10_000);
      return row;
    };
    const first = await attempt(1);
    expect(first).toMatchObject({ status: 'pending', last_status_code: 500 });
    // About 5 s later (with jitter).
    const wait1 = new Date(first.next_attempt_at!).getTime() - new Date(first.updated_at).getTime();
    expect(wait1).toBeGreaterThanOrEqual(4_000);
    expect(wait1).toBeLessThanOrEqual(6_000);
    await sql('update webhook_messages set next_attempt_at = now() where id = ?', [msgId]);
    const second = await attempt(2);
    const wait2 = new Date(second.next_attempt_at!).getTime() - new Date(second.updated_at).getTime();
    expect(wait2).toBeGreaterThanOrEqual(0.9 * 5 * 60_000 - 1_000);
    expect(wait2).toBeLessThanOrEqual(1.1 * 5 * 60_000 + 1_000);
    // Time passes: the third attempt succeeds.
    await sql('update webhook_messages set next_attempt_at = now() where id = ?', [msgId]);
    const third = await waitFor('success', async () => {
      const [r] = await sql<{ status: string; attempts: number }>('select status, attempts from webhook_messages where id = ?', [msgId]);
      return r?.status === 'succeeded' ? r : undefined;
    });
    expect(third.attempts).toBe(3);

    const got = receiver.at('/fail-twice').filter((d) => d.headers['webhook-id'] === msgId);
    expect(got).toHaveLength(3);
    const bodies = got.map((d) => verified(endpoint.secret, d));
    expect(bodies.every((b) => b.type === 'webhook.test')).toBe(true);
    expect(new Set(got.map((d) => d.body)).size).toBe(1);

    const listed = await api('GET', `/webhooks/${endpoint.id}/deliveries`);
    expect(listed.statusCode).toBe(200);
    expect(listed.json().data[0]).toMatchObject({ id: msgId, type: 'webhook.test', status: 'succeeded', attempts: 3, lastStatusCode: 200, nextAttemptAt: null });

    // Sent again on request: a fourth attempt with the same id.
    const retried = await api('POST', `/webhooks/${endpoint.id}/deliveries/${msgId}/retry`);
    expect(retried.statusCode).toBe(200);
    await waitFor('fourth attempt', () => receiver.at('/fail-twice').filter((d) => d.headers['webhook-id'] === msgId).length === 4);
    expect((await api('POST', `/webhooks/${endpoint.id}/deliveries/msg_00000000000000000000000000/retry`)).statusCode).toBe(404);
    await api('DELETE', `/webhooks/${endpoint.id}`);
  });

  it('records 4xx/5xx, resets, redirects, endless answers and hangs as failures, while a healthy endpoint is served at once', async () => {
    const paths = ['/status/404', '/status/503', '/reset', '/redirect', '/huge', '/hang'];
    const endpoints = await Promise.all(paths.map((p) => createEndpoint(p, ['contact.created'])));
    const healthy = await createEndpoint('/ok', ['contact.created']);
    const started = Date.now();
    const created = await api('POST', '/subscribers', { email: 'burst@example.com' });
    const subscriberId = created.json().id as string;
    // The hanging endpoint holds only its own slot: the healthy one is served within seconds.
    const ok = await eventOf('/ok', healthy.secret, 'contact.created', (d) => d.id === subscriberId);
    expect(ok.delivery.at - started).toBeLessThan(5_000);

    const outcomeOf = async (endpointId: string) =>
      waitFor(`attempt of ${endpointId}`, async () => {
        const [r] = await sql<{ status: string; attempts: number; last_status_code: number | null; last_error: string | null }>(
          `select status, attempts, last_status_code, last_error from webhook_messages where endpoint_id = ? and type = 'contact.created'`,
          [endpointId],
        );
        return r && r.attempts >= 1 ? r : undefined;
      }, 20_000);
    const results = Object.fromEntries(await Promise.all(endpoints.map(async (e, i) => [paths[i], await outcomeOf(e.id)] as const)));
    expect(results['/status/404']).toMatchObject({ status: 'pending', last_status_code: 404, last_error: 'HTTP 404' });
    expect(results['/status/503']).toMatchObject({ status: 'pending', last_status_code: 503 });
    expect(results['/reset']).toMatchObject({ status: 'pending', last_status_code: null });
    expect(results['/reset']!.last_error).toMatch(/socket|ECONNRESET|closed/i);
    // Redirects are not followed: the 302 is the answer, and /ok never sees this event.
    expect(results['/redirect']).toMatchObject({ status: 'pending', last_status_code: 302 });
    // An endless 200 answer is a success read only up to the cap.
    expect(results['/huge']).toMatchObject({ status: 'succeeded', last_status_code: 200 });
    expect(results['/hang']).toMatchObject({ status: 'pending', last_status_code: null, last_error: 'no answer within 10 s' });
    expect(receiver.at('/ok').filter((d) => d.headers['webhook-id'] === ok.delivery.headers['webhook-id'])).toHaveLength(1);
    for (const e of [...endpoints, healthy]) await api('DELETE', `/webhooks/${e.id}`);
  }, 40_000);

  it('disables an endpoint whose deliveries have all failed for 5 days, with its reason', async () => {
    const endpoint = await createEndpoint('/status/500', ['contact.created']);
    await sql(`update webhook_endpoints set failing_since = now() - interval '5 days 1 minute' where id = ?`, [endpoint.id]);
    await api('POST', '/subscribers', { email: 'dead@example.com' });
    const disabled = await waitFor('disabled', async () => {
      const got = (await api('GET', `/webhooks/${endpoint.id}`)).json();
      return got.enabled === false ? got : undefined;
    });
    expect(disabled.disabledReason).toMatch(/failed for 5 days.*HTTP 500/);
    // A success clears the streak: a recovering endpoint is not disabled.
    const healthy = await createEndpoint('/ok', ['contact.created']);
    await sql(`update webhook_endpoints set failing_since = now() - interval '6 days' where id = ?`, [healthy.id]);
    await api('POST', '/subscribers', { email: 'alive@example.com' });
    await waitFor('streak cleared', async () => {
      const [r] = await sql<{ failing_since: Date | null; enabled: boolean }>('select failing_since, enabled from webhook_endpoints where id = ?', [healthy.id]);
      return r?.failing_since === null && r.enabled;
    });
    await api('DELETE', `/webhooks/${endpoint.id}`);
    await api('DELETE', `/webhooks/${healthy.id}`);
  });

  it('purges deliveries older than 30 days (the hourly purge-expired job)', async () => {
    const endpoint = await createEndpoint('/ok', ['contact.created']);
    await api('POST', '/subscribers', { email: 'old@example.com' });
    await waitFor('row', async () => (await sql('select 1 from webhook_messages where endpoint_id = ?', [endpoint.id])).length > 0);
    await sql(`update webhook_messages set created_at = now() - interval '31 days' where endpoint_id = ?`, [endpoint.id]);
    // The job finds rows by their time-ordered id: run it as if 31 days had passed.
    const target = PURGE_TARGETS.filter((t) => t.name === 'webhook_deliveries');
    const result = await purgeExpired(ctx.services.orm.em.fork(), ctx.services.config, { now: new Date(Date.now() + 31 * 24 * 3_600_000), targets: target, duty: 1 });
    const purged = result.purged.webhook_deliveries ?? 0;
    expect(purged).toBeGreaterThanOrEqual(1);
    expect(await sql('select 1 from webhook_messages where endpoint_id = ?', [endpoint.id])).toHaveLength(0);
    await api('DELETE', `/webhooks/${endpoint.id}`);
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis, waitForRedis } from '../src/shared/redis.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { workflowsProcessor } from '../src/workers/workflows.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  // The producer connection fails fast until it is ready (no offline queue): wait for it.
  await waitForRedis(ctx.services.redis);
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

function api(method: 'GET' | 'POST' | 'PATCH', url: string, body?: unknown, as = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(as), ...(body === undefined ? {} : { payload: body as object }) });
}

async function subscriber(email: string) {
  return (await api('POST', '/subscribers', { email })).json();
}

async function poll<T>(read: () => Promise<T>, done: (value: T) => boolean, timeoutMs = 5_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (done(value) || Date.now() > deadline) return value;
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('POST /api/v2/events (docs/audience.md "Events")', () => {
  it('records payments and refunds and moves revenue', async () => {
    const s = await subscriber('payer@example.com');
    const paid = await api('POST', '/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'Payer@example.com', data: { amount: 1999, currency: 'EUR', order: 'A-1' } });
    expect(paid.statusCode).toBe(200);
    expect(paid.json()).toEqual({ id: expect.stringMatching(/^evt_[0-9a-z]{26}$/), eventType: 'SUBSCRIBER_PAYMENT' });
    await api('POST', '/events', { eventType: 'SUBSCRIBER_REFUND', subscriber: s.id, data: { amount: 500 } });
    expect((await api('GET', `/subscribers/${s.id}`)).json().revenue).toBe(1499);

    const events = (await api('GET', `/subscribers/${s.id}/events`)).json();
    expect(events).toMatchObject({ object: 'list', has_more: false });
    expect(events.data).toEqual([
      { id: expect.any(String), eventType: 'SUBSCRIBER_REFUND', data: { amount: 500 }, createdAt: expect.stringMatching(/Z$/) },
      { id: paid.json().id, eventType: 'SUBSCRIBER_PAYMENT', data: { amount: 1999, currency: 'EUR', order: 'A-1' }, createdAt: expect.any(String) },
    ]);
    const page = (await api('GET', `/subscribers/${s.id}/events?limit=1`)).json();
    expect(page.has_more).toBe(true);
    const next = (await api('GET', `/subscribers/${s.id}/events?limit=1&after=${page.data[0].id}`)).json();
    expect(next.data[0].eventType).toBe('SUBSCRIBER_PAYMENT');
    // `before` pages back up (docs/foundation.md "Identifiers, time and lists"), newest first; both cursors at once, or a bad one, are 422.
    const back = (await api('GET', `/subscribers/${s.id}/events?limit=1&before=${paid.json().id}`)).json();
    expect(back).toMatchObject({ has_more: false, data: [{ eventType: 'SUBSCRIBER_REFUND' }] });
    expect((await api('GET', `/subscribers/${s.id}/events?before=${paid.json().id}&after=${paid.json().id}`)).statusCode).toBe(422);
    expect((await api('GET', `/subscribers/${s.id}/events?before=bogus`)).statusCode).toBe(422);
  });

  it('updates revenue atomically under concurrent events', async () => {
    const s = await subscriber('busy@example.com');
    await Promise.all(Array.from({ length: 20 }, () => api('POST', '/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: s.id, data: { amount: 100 } })));
    expect((await api('GET', `/subscribers/${s.id}`)).json().revenue).toBe(2000);
  });

  it.each([
    ['unsupported eventType', { eventType: 'SUBSCRIBER_SIGNUP', subscriber: 'payer@example.com', data: { amount: 1 } }],
    ['missing data', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'payer@example.com' }],
    ['non-integer amount', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'payer@example.com', data: { amount: 12.5 } }],
    ['string amount', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'payer@example.com', data: { amount: '12' } }],
    ['negative amount', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'payer@example.com', data: { amount: -1 } }],
    ['missing subscriber', { eventType: 'SUBSCRIBER_PAYMENT', data: { amount: 1 } }],
    ['non-object data', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: 'payer@example.com', data: 5 }],
  ])('refuses %s with 400 validation_error and writes nothing', async (_label, body) => {
    const before = (await api('GET', '/subscribers/payer@example.com')).json().revenue;
    const res = await api('POST', '/events', body);
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 400 });
    expect((await api('GET', '/subscribers/payer@example.com')).json().revenue).toBe(before);
  });

  it('refuses an event that would take revenue past 2^53 - 1 cents either way, writing nothing', async () => {
    const s = await subscriber('whale@example.com');
    const event = (eventType: string, amount: number) => api('POST', '/events', { eventType, subscriber: s.id, data: { amount } });
    expect((await event('SUBSCRIBER_PAYMENT', Number.MAX_SAFE_INTEGER)).statusCode).toBe(200);
    const over = await event('SUBSCRIBER_PAYMENT', 1);
    expect(over.statusCode).toBe(400);
    expect(over.json()).toMatchObject({ name: 'validation_error', message: expect.stringMatching(/^data\.amount: would take the subscriber's revenue/) });
    // Still readable, alone and in a list; the refused event left no row.
    expect((await api('GET', `/subscribers/${s.id}`)).json()).toMatchObject({ revenue: Number.MAX_SAFE_INTEGER });
    expect((await api('GET', '/subscribers?limit=100')).statusCode).toBe(200);
    expect((await api('GET', `/subscribers/${s.id}/events`)).json().data).toHaveLength(1);
    // Refunds: down to -(2^53 - 1), not past it.
    expect((await event('SUBSCRIBER_REFUND', Number.MAX_SAFE_INTEGER)).statusCode).toBe(200);
    expect((await event('SUBSCRIBER_REFUND', Number.MAX_SAFE_INTEGER)).statusCode).toBe(200);
    expect((await event('SUBSCRIBER_REFUND', 1)).statusCode).toBe(400);
    expect((await api('GET', `/subscribers/${s.id}`)).json()).toMatchObject({ revenue: -Number.MAX_SAFE_INTEGER });
  });

  it('answers 404 for an unknown subscriber or one of another organization', async () => {
    const s = await subscriber('theirs@example.com');
    const other = await createOrg(ctx.services, { name: 'Other' });
    for (const ref of ['nobody@example.com', s.id, 'theirs@example.com']) {
      const res = await api('POST', '/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: ref, data: { amount: 1 } }, ref === 'nobody@example.com' ? token : other.token);
      expect(res.statusCode).toBe(404);
      expect(res.json().name).toBe('not_found');
    }
    expect((await api('GET', `/subscribers/${s.id}`)).json().revenue).toBe(0);
  });
});

describe('triggerWorkflows (docs/audience.md "Workflows")', () => {
  let workers: RunningWorkers;
  let connection: ReturnType<typeof createRedis>;
  beforeAll(async () => {
    connection = createRedis(ctx.services.config.redisUrl, 'worker');
    workers = await startWorkers(ctx.services, connection, [workflowsProcessor]);
  });
  afterAll(async () => {
    await workers?.close();
    connection?.disconnect();
  });

  it('enqueues one job per change and the worker records them on the activity', async () => {
    const created = (await api('POST', '/subscribers', { email: 'flow@example.com', tags: ['a'], fields: { plan: 'pro' }, triggerWorkflows: true })).json();
    await api('PATCH', `/subscribers/${created.id}`, { fields: { plan: null }, tags: ['b'], triggerWorkflows: true });
    await api('POST', `/subscribers/${created.id}/unsubscribe`, { triggerWorkflows: true });
    await api('PATCH', `/subscribers/${created.id}`, { name: 'not triggered' });
    const events = await poll(
      async () => (await api('GET', `/subscribers/${created.id}/events?limit=100`)).json().data as Array<{ eventType: string; data: Record<string, unknown> }>,
      (list) => list.length >= 6,
    );
    expect(events.map((e) => e.eventType).reverse()).toEqual([
      'subscriber.created',
      'subscriber.tag_added',
      'subscriber.field_updated',
      'subscriber.tag_added',
      'subscriber.field_updated',
      'subscriber.unsubscribed',
    ]);
    expect(events[0].data).toEqual({ status: 'UNSUBSCRIBED', previousStatus: 'SUBSCRIBED' });
    expect(events[1].data).toEqual({ field: 'plan', value: null });
    expect(events[2].data).toEqual({ tag: { id: expect.any(String), name: 'b' } });
  });

  it('enqueues nothing without triggerWorkflows', async () => {
    const queue = ctx.services.producer.queue('workflows');
    // An earlier test's job may still be running: counted once it has settled, or its move from
    // active to completed would read as a change made by this call.
    const before = await poll(() => queue.getJobCounts(), (counts) => !counts.active && !counts.waiting && !counts.delayed && !counts.prioritized);
    await api('POST', '/subscribers', { email: 'quiet@example.com', tags: ['x'] });
    const after = await queue.getJobCounts();
    expect(after).toEqual(before);
  });
});

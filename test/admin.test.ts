import { Worker } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bullPrefix } from '../src/shared/queues/producer.js';
import { createRedis } from '../src/shared/redis.js';
import { QUEUE_NAMES } from '../src/shared/queues/registry.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

const PASSWORD = 'correct horse battery staple';

function basic(user: string, password: string): Record<string, string> {
  return { authorization: `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}` };
}

describe('queue dashboard at /admin/queues (docs/operations.md "Queue dashboard")', () => {
  let ctx: TestContext;
  let token: string;

  beforeAll(async () => {
    ctx = await createTestContext({ ADMIN_PASSWORD: PASSWORD });
    ({ token } = await createOrg(ctx.services));
  });
  afterAll(async () => ctx?.close());

  it('asks for basic auth without credentials', async () => {
    const res = await ctx.app.inject({ url: '/admin/queues' });
    expect(res.statusCode).toBe(401);
    expect(res.headers['www-authenticate']).toMatch(/^Basic realm="[^"]+"/);
    expect(res.json()).toEqual({ name: 'unauthorized', message: expect.any(String), statusCode: 401 });
  });

  it.each([
    ['a wrong password', basic('admin', 'wrong')],
    ['the password with one character more', basic('admin', `${PASSWORD}x`)],
    ['another user', basic('root', PASSWORD)],
    ['an empty password', basic('admin', '')],
    ['a malformed header', { authorization: 'Basic !!!' }],
  ])('refuses %s with 401', async (_label, headers) => {
    for (const url of ['/admin/queues', '/admin/queues/api/queues']) {
      const res = await ctx.app.inject({ url, headers });
      expect(res.statusCode).toBe(401);
      expect(res.headers['www-authenticate']).toBeDefined();
    }
  });

  it('is never reachable with an API token', async () => {
    // The token is valid on the API...
    expect((await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(token) })).statusCode).toBe(200);
    // ...and no key to the dashboard, wherever it is sent.
    for (const url of ['/admin/queues', '/admin/queues/api/queues', `/admin/queues/api/queues/maintenance/retry/failed`]) {
      const res = await ctx.app.inject({ method: url.includes('retry') ? 'PUT' : 'GET', url, headers: bearer(token) });
      expect(res.statusCode).toBe(401);
    }
  });

  it('serves the board with the right password', async () => {
    const res = await ctx.app.inject({ url: '/admin/queues', headers: basic('admin', PASSWORD) });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/text\/html/);
    expect(res.body).toContain('<base href="/admin/queues/');
    const script = /src="(static\/js\/main[^"]+)"/.exec(res.body)?.[1];
    expect(script).toBeDefined();
    const asset = await ctx.app.inject({ url: `/admin/queues/${script}`, headers: basic('admin', PASSWORD) });
    expect(asset.statusCode).toBe(200);
    expect((await ctx.app.inject({ url: `/admin/queues/${script}` })).statusCode).toBe(401);
  });

  it('lists every queue of the registry through its JSON API', async () => {
    const res = await ctx.app.inject({ url: '/admin/queues/api/queues', headers: basic('admin', PASSWORD) });
    expect(res.statusCode).toBe(200);
    const names = (res.json().queues as Array<{ name: string }>).map((q) => q.name).sort();
    expect(names).toEqual([...QUEUE_NAMES].sort());
  });

  it('retries and cleans failed jobs', async () => {
    const queue = ctx.services.producer.queue('maintenance');
    const auth = basic('admin', PASSWORD);
    await queue.add('purge-expired', {}, { jobId: 'will-fail-1' });
    await queue.add('purge-expired', {}, { jobId: 'will-fail-2' });
    await failWaitingJobs(2);

    const retry = await ctx.app.inject({ method: 'PUT', url: '/admin/queues/api/queues/maintenance/retry/failed', headers: auth });
    expect(retry.statusCode).toBe(200);
    expect(await queue.getFailedCount()).toBe(0);
    expect(await queue.getJobState('will-fail-1')).toBe('waiting');

    await failWaitingJobs(2);
    const clean = await ctx.app.inject({ method: 'PUT', url: '/admin/queues/api/queues/maintenance/will-fail-1/clean', headers: auth });
    expect(clean.statusCode).toBeLessThan(300);
    expect(await queue.getJob('will-fail-1')).toBeUndefined();
    expect(await queue.getJobState('will-fail-2')).toBe('failed');
  });

  /** Runs a worker whose every job fails (one attempt) until `count` jobs have failed. */
  async function failWaitingJobs(count: number): Promise<void> {
    const worker = new Worker(
      'maintenance',
      async () => {
        throw new Error('boom');
      },
      { connection: createRedis(ctx.env.config.redisUrl, 'worker'), prefix: bullPrefix(ctx.env.config.redisPrefix) },
    );
    try {
      const queue = ctx.services.producer.queue('maintenance');
      for (let i = 0; i < 200 && (await queue.getFailedCount()) < count; i++) await new Promise((r) => setTimeout(r, 25));
      expect(await queue.getFailedCount()).toBe(count);
    } finally {
      await worker.close();
      await worker.disconnect();
    }
  }
});

describe('queue dashboard without ADMIN_PASSWORD', () => {
  let ctx: TestContext;
  beforeAll(async () => {
    ctx = await createTestContext();
  });
  afterAll(async () => ctx?.close());

  it('is off: 404 whatever the credentials', async () => {
    for (const headers of [{}, basic('admin', ''), basic('admin', 'anything')]) {
      for (const url of ['/admin/queues', '/admin/queues/api/queues']) {
        const res = await ctx.app.inject({ url, headers });
        expect(res.statusCode).toBe(404);
        expect(res.json().name).toBe('not_found');
      }
    }
  });
});

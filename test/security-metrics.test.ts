import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from './helpers/context.js';

/** GET /metrics (docs/security.md): local only without ADMIN_PASSWORD; one collection for concurrent scrapes. */
describe('GET /metrics without ADMIN_PASSWORD', () => {
  let ctx: TestContext;

  beforeAll(async () => {
    ctx = await createTestContext();
  });
  afterAll(async () => ctx?.close());

  it('is refused to a peer that is not this host', async () => {
    const res = await ctx.app.inject({ url: '/metrics', remoteAddress: '203.0.113.9' });
    expect(res.statusCode).toBe(403);
    expect(res.json()).toMatchObject({ name: 'forbidden', statusCode: 403 });
    expect(res.body).not.toContain('mailroom_');
    const mapped = await ctx.app.inject({ url: '/metrics', remoteAddress: '::ffff:198.51.100.7' });
    expect(mapped.statusCode).toBe(403);
  });

  it('is answered to loopback peers', async () => {
    for (const remoteAddress of ['127.0.0.1', '::1', '::ffff:127.0.0.1']) {
      const res = await ctx.app.inject({ url: '/metrics', remoteAddress });
      expect(res.statusCode, remoteAddress).toBe(200);
      expect(res.body).toContain('mailroom_http_requests_total');
    }
  });

  it('is refused to a loopback peer that forwards another client (a reverse proxy on this host)', async () => {
    for (const headers of [{ 'x-forwarded-for': '203.0.113.9' }, { forwarded: 'for=203.0.113.9' }, { 'x-real-ip': '203.0.113.9' }]) {
      const res = await ctx.app.inject({ url: '/metrics', remoteAddress: '127.0.0.1', headers });
      expect(res.statusCode, Object.keys(headers)[0]).toBe(403);
      expect(res.body).not.toContain('mailroom_');
    }
  });
});

describe('concurrent scrapes', () => {
  let ctx: TestContext;

  // A context of its own: the count is cached 30 s after a scrape, and this one must be the first.
  beforeAll(async () => {
    ctx = await createTestContext();
  });
  afterAll(async () => ctx?.close());

  it('share one count over emails', async () => {
    // One connection holds the emails table, so a count waits; another sees how many wait
    // (pg_stat_activity is read outside any transaction: inside one it is a snapshot).
    const holder = new pg.Client({ connectionString: ctx.services.config.databaseUrl });
    const observer = new pg.Client({ connectionString: ctx.services.config.databaseUrl });
    await holder.connect();
    await observer.connect();
    const waiting = async () =>
      Number(
        (
          await observer.query<{ n: string }>(
            `select count(*) as n from pg_stat_activity
              where datname = current_database() and wait_event_type = 'Lock' and query like 'select status, count(*) as count from emails%'`,
          )
        ).rows[0]!.n,
      );
    try {
      await holder.query('begin');
      await holder.query('lock table emails in access exclusive mode');
      // `.then` starts each request now (inject is lazy): five scrapes at once.
      const scrapes = Array.from({ length: 5 }, () => ctx.app.inject({ url: '/metrics' }).then((r) => r));
      const deadline = Date.now() + 1_500;
      while ((await waiting()) === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      // Time for the other scrapes to start counts of their own, were they to.
      await new Promise((r) => setTimeout(r, 300));
      expect(await waiting()).toBe(1);
      await holder.query('commit');
      expect((await Promise.all(scrapes)).map((r) => r.statusCode)).toEqual([200, 200, 200, 200, 200]);
    } finally {
      await holder.query('rollback').catch(() => {});
      await holder.end();
      await observer.end();
    }
  });
});

describe('GET /metrics with ADMIN_PASSWORD', () => {
  let ctx: TestContext;

  beforeAll(async () => {
    ctx = await createTestContext({ ADMIN_PASSWORD: 'operator-password' });
  });
  afterAll(async () => ctx?.close());

  it('is answered to the operator from anywhere, and to nobody else', async () => {
    const auth = `Basic ${Buffer.from('admin:operator-password').toString('base64')}`;
    expect((await ctx.app.inject({ url: '/metrics', remoteAddress: '203.0.113.9', headers: { authorization: auth } })).statusCode).toBe(200);
    expect((await ctx.app.inject({ url: '/metrics', remoteAddress: '127.0.0.1' })).statusCode).toBe(401);
  });
});

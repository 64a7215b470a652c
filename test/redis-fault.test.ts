import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startCountingSink, type CountingSink } from './helpers/counting-sink.js';
import { TestRedis, waitFor } from './helpers/outages.js';
import { runService, type ServiceProcess } from './helpers/process.js';
import { Redis } from 'ioredis';
import { createRedis } from '../src/shared/redis.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { maintenanceProcessor } from '../src/workers/maintenance.js';
import { startWorkers } from '../src/workers/runner.js';

// Issue 9: Redis loses every key (killed and restarted empty: no RDB, no AOF) in the middle
// of a send run. PostgreSQL is the source of truth: the reconciler re-enqueues, from it,
// every accepted email whose job is gone, and each one still arrives exactly once.
const TOTAL = 600;

let redis: TestRedis;
let sink: CountingSink;
let ctx: TestContext;
let token: string;
const processes: ServiceProcess[] = [];

beforeAll(async () => {
  redis = await TestRedis.start();
  sink = await startCountingSink();
  ctx = await createTestContext({
    REDIS_URL: redis.url,
    MAIL_TRANSPORT: 'smtp',
    SMTP_URL: sink.url,
    // Fast reconciler for the test (default: every minute, for emails queued a minute ago).
    EMAIL_RECONCILE_EVERY_MS: '500',
    EMAIL_RECONCILE_GRACE_MS: '0',
    LOG_LEVEL: 'warn',
  });
  ({ token } = await createOrg(ctx.services));
});

afterAll(async () => {
  for (const p of processes) p.kill();
  await Promise.all(processes.map((p) => p.exited));
  await ctx?.close();
  await sink?.close();
  await redis?.dispose();
});

describe('Redis loses its data mid-run', () => {
  it('delivers every accepted email exactly once through the reconciler', { timeout: 60_000 }, async () => {
    const ids: string[] = [];
    for (let b = 0; b < TOTAL / 100; b++) {
      const payload = Array.from({ length: 100 }, (_, i) => ({ from: 'Acme <receipts@acme.test>', to: `user${b * 100 + i}@example.com`, subject: `Receipt ${i}`, html: '<p>Receipt</p>' }));
      const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers: bearer(token), payload });
      expect(res.statusCode).toBe(200);
      ids.push(...res.json().data.map((d: { id: string }) => d.id));
    }

    const worker = runService('src/workers/main.ts', [], ctx.env.env);
    processes.push(worker);
    await waitFor('a third delivered', () => sink.accepted >= TOTAL / 3, 30_000, 5);
    await redis.stop('kill');
    await redis.start();
    const atRestart = sink.accepted;

    const em = ctx.services.orm.em.fork();
    await waitFor(
      'every email sent',
      async () => {
        const [row] = await em.execute<{ sent: string }[]>(`select count(*) filter (where status = 'sent') as sent from emails`);
        return Number(row!.sent) >= TOTAL;
      },
      40_000,
      100,
    );
    await new Promise((r) => setTimeout(r, 300));

    expect(atRestart).toBeLessThan(TOTAL); // the loss did happen mid-run
    expect([...sink.received].filter(([, n]) => n > 1)).toEqual([]);
    expect(ids.filter((id) => sink.received.get(`${id}@acme.test`) !== 1)).toEqual([]);
    expect(sink.accepted).toBe(TOTAL);
    // The reconciler did the work: it logged what it re-enqueued.
    expect(worker.stdout() + worker.stderr()).toMatch(/re-enqueued queued emails whose job was missing/);
  });
});

describe('Redis emptied under a live connection (FLUSHALL: no reconnect)', () => {
  it('puts every job scheduler back by itself, keeping its next run', { timeout: 30_000 }, async () => {
    const running = await startWorkers(ctx.services, createRedis(redis.url, 'worker'), [emailSendProcessor('emails'), maintenanceProcessor] as never, undefined, { reinstallEveryMs: 200 });
    try {
      const ids = async () => (await Promise.all(['emails', 'maintenance'].map((q) => ctx.services.producer.queue(q as 'emails').getJobSchedulers()))).flat().map((j) => `${j.key}@${j.next}`).sort();
      const before = await ids();
      expect(before.map((s) => s.split('@')[0])).toEqual(['emails-purge-idempotency-keys', 'emails-reconcile', 'purge-expired']);
      // Upserted again and again meanwhile: an hourly purge's next run is not pushed back.
      await new Promise((r) => setTimeout(r, 700));
      expect((await ids()).filter((s) => s.startsWith('purge-expired'))).toEqual(before.filter((s) => s.startsWith('purge-expired')));
      const flusher = new Redis(redis.url);
      await flusher.flushall();
      await flusher.quit();
      expect(await ids()).toEqual([]);
      await waitFor('the schedulers back', async () => (await ids()).length === 3, 10_000, 50);
    } finally {
      await running.close();
    }
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { waitFor } from './helpers/outages.js';
import { runService, type ServiceProcess } from './helpers/process.js';
import { startWebhookReceiver, type WebhookReceiver } from './helpers/webhook-receiver.js';

let ctx: TestContext;
let receiver: WebhookReceiver;
let token: string;
const processes: ServiceProcess[] = [];

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => {
  for (const p of processes) p.kill();
  await ctx?.close();
  await receiver?.close();
});

async function startWorker(): Promise<ServiceProcess> {
  const worker = runService('src/workers/main.ts', [], { ...ctx.env.env, WORKER_QUEUES: 'webhooks', LOG_LEVEL: 'info' });
  processes.push(worker);
  await worker.waitFor(/workers started/, 30_000);
  return worker;
}

/** Every key of this test's Redis prefix: the queues, their schedulers and any job. */
async function flushRedis(): Promise<number> {
  const redis = createRedis(ctx.env.config.redisUrl, 'worker');
  let deleted = 0;
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${ctx.env.config.redisPrefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length) deleted += await redis.del(...keys);
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
  return deleted;
}

const contactIds = (subscriberId: string) =>
  receiver
    .at('/ok')
    .filter((d) => JSON.parse(d.body).data.id === subscriberId)
    .map((d) => String(d.headers['webhook-id']));

describe('the outbox survives a killed worker and a flushed Redis', () => {
  it('delivers an event written while no worker ran and Redis lost everything, exactly once after de-duplication', async () => {
    const created = await ctx.app.inject({ method: 'POST', url: '/api/v2/webhooks', headers: bearer(token), payload: { url: `${receiver.url}/ok`, events: ['contact.created'] } });
    expect(created.statusCode).toBe(200);

    const first = await startWorker();
    const warmup = (await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(token), payload: { email: 'before@example.com' } })).json().id as string;
    await waitFor('delivery by the first worker', () => contactIds(warmup).length > 0, 20_000);

    // The worker dies without a chance to clean up, then the action, then Redis loses its data.
    first.child.kill('SIGKILL');
    await first.exited;
    const action = await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(token), payload: { email: 'during@example.com' } });
    expect(action.statusCode).toBe(200);
    const subscriberId = action.json().id as string;
    expect(await flushRedis()).toBeGreaterThan(0);
    await new Promise((r) => setTimeout(r, 500));
    expect(contactIds(subscriberId)).toHaveLength(0);

    const second = await startWorker();
    await waitFor('delivery after the restart', () => contactIds(subscriberId).length > 0, 20_000);
    // Time for any duplicate to arrive.
    await new Promise((r) => setTimeout(r, 1_500));
    const ids = contactIds(subscriberId);
    expect(new Set(ids).size).toBe(1);
    expect(ids).toHaveLength(1);
    const [row] = await ctx.services.orm.em.fork().execute<{ status: string; attempts: number }[]>(
      `select status, attempts from webhook_messages where id = ?`,
      [ids[0]],
      'all',
    );
    expect(row).toEqual({ status: 'succeeded', attempts: 1 });
    second.kill();
    await second.exited;
  }, 90_000);
});

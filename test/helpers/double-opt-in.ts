import { createRedis, waitForRedis } from '../../src/shared/redis.js';
import { startWorkers } from '../../src/workers/runner.js';
import { subscribersProcessor } from '../../src/workers/subscribers.js';
import { createOrg, createTestContext, type TestContext } from './context.js';
import { until } from './until.js';

/**
 * A test service with an organization that uses double opt-in and the subscribers worker
 * running (it sends the confirmation emails); `close` stops all of it.
 */
export async function doubleOptInContext(): Promise<{ ctx: TestContext; token: string; organizationId: string; close: () => Promise<void> }> {
  const ctx = await createTestContext({ PUBLIC_URL: 'https://mail.example.test' });
  // The producer connection fails fast until it is ready (no offline queue): wait for it.
  await waitForRedis(ctx.services.redis);
  const { token, organizationId } = await createOrg(ctx.services, { name: 'Acme News', doubleOptIn: true });
  const connection = createRedis(ctx.services.config.redisUrl, 'worker');
  const workers = await startWorkers(ctx.services, connection, [subscribersProcessor]);
  return {
    ctx,
    token,
    organizationId,
    async close() {
      await workers.close();
      connection.disconnect();
      await ctx.close();
    },
  };
}

/** The `subscribers` job of this id once it has finished (completed or failed). */
export async function finishedJob(ctx: TestContext, id: string, timeoutMs = 10_000) {
  const queue = ctx.services.producer.queue('subscribers');
  // One read of the job: its finish time and return value come together.
  return until(() => queue.getJob(id), (job) => Boolean(job?.finishedOn), timeoutMs);
}

/** The `send-confirmation` jobs of a subscriber in any state, the oldest confirmation first. */
export async function confirmationJobsOf(ctx: TestContext, subscriberId: string) {
  const jobs = await ctx.services.producer.queue('subscribers').getJobs();
  return jobs
    .filter((job) => job.name === 'send-confirmation' && job.data.subscriberId === subscriberId)
    .sort((a, b) => (a.data.owedSince ?? 0) - (b.data.owedSince ?? 0));
}

/** The subscriber's `count`-th confirmation job (1 = its first) once it has finished. */
export async function finishedConfirmation(ctx: TestContext, subscriberId: string, count = 1, timeoutMs = 10_000) {
  const jobs = await until(
    () => confirmationJobsOf(ctx, subscriberId),
    (found) => found.length >= count && Boolean(found[count - 1]!.finishedOn),
    timeoutMs,
  );
  return jobs[count - 1]!;
}

import { createRedis } from '../../src/shared/redis.js';
import { startWorkers, type QueueProcessor } from '../../src/workers/runner.js';
import type { TestContext } from './context.js';

export interface TestWorkers {
  /** Stops the workers (their active jobs finish), then drops their Redis connection. */
  close(): Promise<void>;
}

/**
 * In-process workers for a test: the processors given, on a `worker` Redis connection of
 * their own, as the worker process runs them (src/workers/main.ts).
 */
export async function startTestWorkers(ctx: TestContext, processors: QueueProcessor[]): Promise<TestWorkers> {
  const redis = createRedis(ctx.env.config.redisUrl, 'worker');
  try {
    const workers = await startWorkers(ctx.services, redis, processors);
    return {
      async close() {
        await workers.close();
        redis.disconnect();
      },
    };
  } catch (error) {
    redis.disconnect();
    throw error;
  }
}

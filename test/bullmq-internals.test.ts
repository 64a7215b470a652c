import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';

// The email reconciler (src/workers/emails.ts, oldestUnexpandedBatch) finds the oldest
// `send-batch` job still waiting by the score BullMQ gives a prioritized job, which no public
// API exposes in a usable order. bullmq is pinned in package.json; this fails when an upgrade
// changes the layout, before the reconciler silently stops bounding its pages.
const redis = new Redis(process.env.REDIS_URL || 'redis://127.0.0.1:6379', { maxRetriesPerRequest: null });
const queue = new Queue('emails', { connection: redis, prefix: `mrtest-bullmq-${process.pid}` });

afterAll(async () => {
  await queue.obliterate({ force: true });
  await queue.close();
  redis.disconnect();
});

describe('BullMQ internals the reconciler reads', () => {
  it('scores a prioritized job priority * 2^32 + a counter, in its prioritized sorted set', async () => {
    const first = await queue.add('send-batch', {}, { priority: 2, jobId: 'batch-a' });
    const second = await queue.add('send-batch', {}, { priority: 2, jobId: 'batch-b' });
    await queue.add('send', {}, { priority: 1, jobId: 'send-a' });
    const score = async (id: string) => Number(await redis.zscore(queue.keys.prioritized!, id));
    for (const id of [first.id!, second.id!]) {
      expect(await score(id)).toBeGreaterThanOrEqual(2 * 2 ** 32);
      expect(await score(id)).toBeLessThan(3 * 2 ** 32);
    }
    expect(await score(second.id!)).toBeGreaterThan(await score(first.id!));
    expect(await score('send-a')).toBeLessThan(2 * 2 ** 32);
    const [oldest] = await redis.zrangebyscore(queue.keys.prioritized!, 2 * 2 ** 32, '+inf', 'LIMIT', 0, 1);
    expect(oldest).toBe('batch-a');
    expect((await queue.getJob('batch-a'))?.timestamp).toBe(first.timestamp);
  });
});

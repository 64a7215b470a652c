import { Queue, type JobsOptions } from 'bullmq';
import type { Redis } from 'ioredis';
import { parsePayload, type JobName, type JobPayload, type QueueName } from './registry.js';

export function bullPrefix(redisPrefix: string): string {
  return `${redisPrefix}:bull`;
}

export interface JobRequest<Q extends QueueName, J extends JobName<Q>> {
  name: J;
  data: JobPayload<Q, J>;
  /** A business key (e.g. the email id). Never contains ':' (BullMQ uses it in keys). */
  jobId?: string;
  opts?: Omit<JobsOptions, 'jobId'>;
}

// Completed jobs are kept briefly (so a duplicate add with the same jobId is a no-op while a
// retry storm could still produce one); failed ones longer, for the operator to inspect.
const DEFAULT_JOB_OPTIONS: JobsOptions = {
  removeOnComplete: { age: 3600, count: 10_000 },
  removeOnFail: { age: 7 * 24 * 3600, count: 50_000 },
};

/** The typed producer: one BullMQ Queue per queue name, made on first use. */
export class QueueProducer {
  private readonly queues = new Map<QueueName, Queue>();

  constructor(
    private readonly connection: Redis,
    private readonly redisPrefix: string,
  ) {}

  queue(name: QueueName): Queue {
    let queue = this.queues.get(name);
    if (!queue) {
      queue = new Queue(name, {
        connection: this.connection,
        prefix: bullPrefix(this.redisPrefix),
        defaultJobOptions: DEFAULT_JOB_OPTIONS,
      });
      // Errors surface on the awaited calls; this only stops an unhandled 'error' event.
      queue.on('error', () => {});
      this.queues.set(name, queue);
    }
    return queue;
  }

  async add<Q extends QueueName, J extends JobName<Q>>(queue: Q, job: JobRequest<Q, J>): Promise<void> {
    await this.addBulk(queue, [job]);
  }

  async addBulk<Q extends QueueName, J extends JobName<Q>>(queue: Q, jobs: JobRequest<Q, J>[]): Promise<void> {
    if (jobs.length === 0) return;
    const prepared = jobs.map((job) => {
      if (job.jobId?.includes(':')) throw new Error(`job id ${job.jobId} contains ':'`);
      return { name: job.name, data: parsePayload(queue, job.name, job.data), opts: { ...job.opts, jobId: job.jobId } };
    });
    if (prepared.length === 1) {
      const [one] = prepared;
      await this.queue(queue).add(one.name, one.data, one.opts);
    } else {
      await this.queue(queue).addBulk(prepared);
    }
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    this.queues.clear();
  }
}

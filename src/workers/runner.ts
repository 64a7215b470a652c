import { RequestContext } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';
import { Worker, type Job, type WorkerOptions } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Services } from '../shared/container.js';
import type { Logger } from '../shared/logger.js';
import { bullPrefix } from '../shared/queues/producer.js';
import { parsePayload, type JobName, type JobPayload, type QueueName } from '../shared/queues/registry.js';

export interface JobContext {
  services: Services;
  /** A fresh fork for this job only (STYLE 8). */
  em: EntityManager;
  log: Logger;
  job: Job;
}

export type JobHandler<Q extends QueueName, J extends JobName<Q>> = (payload: JobPayload<Q, J>, ctx: JobContext) => Promise<unknown>;

/** What a feature registers to consume one queue. */
export interface QueueProcessor<Q extends QueueName = QueueName> {
  queue: Q;
  handlers: { [J in JobName<Q>]: JobHandler<Q, J> };
  concurrency?: number;
  /** BullMQ options for this queue's Worker (limiter, lock duration, ...). */
  workerOptions?: Partial<Omit<WorkerOptions, 'connection' | 'prefix' | 'concurrency' | 'autorun'>>;
  /** Runs once when the worker starts: e.g. `upsertJobScheduler` for periodic jobs. */
  onStart?: (services: Services) => Promise<void>;
}

export function defineProcessor<Q extends QueueName>(processor: QueueProcessor<Q>): QueueProcessor<Q> {
  return processor;
}

export interface RunningWorkers {
  queues: QueueName[];
  workers: Worker[];
  /** Stops taking jobs, waits for the active ones to finish, closes connections. */
  close(): Promise<void>;
}

/**
 * Starts one BullMQ Worker per processor whose queue is selected (WORKER_QUEUES, default
 * all). Each job runs in its own MikroORM fork with a child logger and a parsed payload.
 */
export async function startWorkers(
  services: Services,
  connection: Redis,
  processors: QueueProcessor[],
  selected?: string[],
): Promise<RunningWorkers> {
  const chosen = selected ? processors.filter((p) => selected.includes(p.queue)) : processors;
  const unknown = (selected ?? []).filter((name) => !processors.some((p) => p.queue === name));
  if (unknown.length > 0) throw new Error(`WORKER_QUEUES: unknown queue ${unknown.join(', ')}`);

  const workers: Worker[] = [];
  for (const processor of chosen) {
    const worker = new Worker(
      processor.queue,
      async (job) => {
        const log = services.logger.child({ queue: processor.queue, job: job.name, jobId: job.id, attempt: job.attemptsMade + 1 });
        const handler = (processor.handlers as Record<string, JobHandler<QueueName, never>>)[job.name];
        if (!handler) throw new Error(`no handler for job ${job.name} on queue ${processor.queue}`);
        const payload = parsePayload(processor.queue, job.name, job.data) as never;
        const em = services.orm.em.fork();
        return RequestContext.create(em, () => handler(payload, { services, em, log, job }));
      },
      {
        ...processor.workerOptions,
        connection,
        prefix: bullPrefix(services.config.redisPrefix),
        concurrency: processor.concurrency ?? 4,
        autorun: true,
      },
    );
    worker.on('failed', (job, error) => {
      services.logger.warn({ queue: processor.queue, jobId: job?.id, err: error }, 'job failed');
    });
    worker.on('error', (error) => services.logger.debug({ queue: processor.queue, err: error }, 'worker connection error'));
    workers.push(worker);
  }
  for (const processor of chosen) await processor.onStart?.(services);

  return {
    queues: chosen.map((p) => p.queue),
    workers,
    async close() {
      await Promise.all(workers.map((w) => w.close()));
    },
  };
}

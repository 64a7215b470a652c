import type { EntityManager } from '@mikro-orm/postgresql';
import { DelayedError, Worker, type Job, type WorkerOptions } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Services } from '../shared/container.js';
import { dependencyStatus, downDependencies } from '../shared/dependencies.js';
import { isDependencyDown } from '../shared/dependency-errors.js';
import type { Logger } from '../shared/logger.js';
import { bullPrefix } from '../shared/queues/producer.js';
import { parsePayload, type JobName, type JobPayload, type QueueName } from '../shared/queues/registry.js';

// How often a worker process upserts its queues' job schedulers again (see startWorkers).
const REINSTALL_MS = 30_000;

export interface JobContext {
  services: Services;
  /** A fresh fork for this job only (docs/architecture.md "Conventions"). */
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
  /**
   * Runs when the worker starts, and again after a reconnect and every REINSTALL_MS (so it
   * must be idempotent): e.g. `upsertJobScheduler` for periodic jobs.
   */
  onStart?: (services: Services) => Promise<void>;
}

export function defineProcessor<Q extends QueueName>(processor: QueueProcessor<Q>): QueueProcessor<Q> {
  return processor;
}

export interface RunningWorkers {
  queues: QueueName[];
  workers: Worker[];
  /** True while this process has stopped taking jobs because PostgreSQL or Redis is down. */
  readonly paused: boolean;
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
  /** `reinstallEveryMs`: how often the job schedulers are upserted again (tests make it short). */
  options: { reinstallEveryMs?: number } = {},
): Promise<RunningWorkers> {
  const chosen = selected ? processors.filter((p) => selected.includes(p.queue)) : processors;
  const unknown = (selected ?? []).filter((name) => !processors.some((p) => p.queue === name));
  if (unknown.length > 0) throw new Error(`WORKER_QUEUES: unknown queue ${unknown.join(', ')}`);

  const workers: Worker[] = [];
  const guard = new DependencyGuard(services, workers);
  for (const processor of chosen) {
    const queue = processor.queue;
    services.metrics.workerPaused.set({ queue }, 0);
    // This queue's series, looked up once rather than by their labels on every job.
    const metrics = {
      completed: services.metrics.jobDuration.labels({ queue, outcome: 'completed' }),
      failed: services.metrics.jobDuration.labels({ queue, outcome: 'failed' }),
      deferred: services.metrics.jobDuration.labels({ queue, outcome: 'deferred' }),
      jobsCompleted: services.metrics.jobsCompleted.labels({ queue }),
      jobsFailed: services.metrics.jobsFailed.labels({ queue }),
      jobsDeferred: services.metrics.jobsDeferred.labels({ queue }),
    };
    const worker = new Worker(
      queue,
      async (job, token) => {
        // Taken after the guard tripped (a blocking fetch already under way): put it back untouched.
        if (guard.down) {
          metrics.jobsDeferred.inc();
          return deferJob(job, token, undefined);
        }
        const started = performance.now();
        const ctx = new LazyJobContext(services, job, queue);
        try {
          const handler = (processor.handlers as Record<string, JobHandler<QueueName, never>>)[job.name];
          if (!handler) throw new Error(`no handler for job ${job.name} on queue ${queue}`);
          const payload = parsePayload(queue, job.name, job.data) as never;
          const result = await handler(payload, ctx);
          metrics.completed.observe((performance.now() - started) / 1000);
          metrics.jobsCompleted.inc();
          return result;
        } catch (error) {
          // The handler moved its job to the delayed set itself (a re-poll, a rate limit's
          // wait): it neither failed nor completed, and no metric counts it.
          if (error instanceof DelayedError) throw error;
          if (!isDependencyDown(error)) {
            metrics.failed.observe((performance.now() - started) / 1000);
            metrics.jobsFailed.inc();
            throw error;
          }
          const log = ctx.log;
          // PostgreSQL or Redis is down: the job is not at fault, so it must not spend an
          // attempt. Stop taking jobs until both answer, and put this one back for later.
          metrics.deferred.observe((performance.now() - started) / 1000);
          metrics.jobsDeferred.inc();
          log.warn({ err: error }, 'dependency down: job put back, worker pausing');
          guard.trip();
          return deferJob(job, token, error);
        }
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
      services.logger.warn({ queue, jobId: job?.id, err: error }, 'job failed');
    });
    worker.on('error', (error) => services.logger.debug({ queue, err: error }, 'worker connection error'));
    worker.on('paused', () => services.metrics.workerPaused.set({ queue }, 1));
    worker.on('resumed', () => services.metrics.workerPaused.set({ queue }, 0));
    workers.push(worker);
  }
  // Started means connected: a worker whose blocking connection is still being set up
  // rejects that set-up's commands, unhandled, when it is closed (a stop right after start),
  // and the process exits 1 instead of 0.
  await Promise.all(workers.map((worker) => worker.waitUntilReady()));
  for (const processor of chosen) await processor.onStart?.(services);
  // A Redis that comes back empty (restarted without persistence) has lost the job schedulers
  // (the reconcilers among them): upserted again whenever the connection is ready again. One
  // emptied under a live connection (FLUSHALL, a failover to an empty replica) gives no such
  // event: they are upserted every REINSTALL_MS as well. An upsert is idempotent and keeps a
  // scheduler's next run (BullMQ keeps the slot of an unchanged `every`), so it costs a few
  // commands and postpones nothing.
  const reinstall = () => {
    for (const processor of chosen) {
      processor.onStart?.(services).catch((error: unknown) => services.logger.warn({ err: error, queue: processor.queue }, "could not set up the queue's schedulers again"));
    }
  };
  services.redis.on('ready', reinstall);
  const reinstalling = setInterval(() => {
    if (services.redis.status === 'ready') reinstall();
  }, options.reinstallEveryMs ?? REINSTALL_MS);
  reinstalling.unref();

  return {
    queues: chosen.map((p) => p.queue),
    workers,
    get paused() {
      return guard.down;
    },
    async close() {
      services.redis.off('ready', reinstall);
      clearInterval(reinstalling);
      guard.stop();
      await Promise.all(workers.map((w) => w.close()));
    },
  };
}

/**
 * The context of one job. Its fork and child logger are made on first use: a job that
 * needs neither (a send writes through its own batched statements and logs only when
 * something goes wrong) costs neither. No RequestContext: handlers use `ctx.em` (the
 * global EntityManager throws, allowGlobalContext is false), and the AsyncLocalStorage of
 * RequestContext would put a hook on every promise of the process.
 */
class LazyJobContext implements JobContext {
  private fork: EntityManager | undefined;
  private logger: Logger | undefined;

  constructor(
    readonly services: Services,
    readonly job: Job,
    private readonly queue: QueueName,
  ) {}

  get em(): EntityManager {
    return (this.fork ??= this.services.orm.em.fork());
  }

  get log(): Logger {
    const { job } = this;
    return (this.logger ??= this.services.logger.child({ queue: this.queue, job: job.name, jobId: job.id, attempt: job.attemptsMade + 1 }));
  }
}

// A put-back job becomes due again after this long. Workers of this process stay paused
// until the dependencies answer anyway; this only spaces out other processes' retries.
const DEFER_MS = 1_000;

/**
 * Moves the job to the delayed set without counting an attempt (BullMQ's manual delay
 * pattern: moveToDelayed, then DelayedError so the worker neither completes nor fails it).
 * With Redis down the move waits on the worker connection until Redis is back; if the job's
 * lock was lost meanwhile, BullMQ's stalled-job check puts it back in the queue instead.
 */
async function deferJob(job: Job, token: string | undefined, cause: unknown): Promise<never> {
  try {
    await job.moveToDelayed(Date.now() + DEFER_MS, token);
  } catch (moveError) {
    throw cause ?? moveError;
  }
  throw new DelayedError();
}

// Polling while a dependency is down: first soon, then backing off to every 5 s.
const POLL_FIRST_MS = 250;
const POLL_MAX_MS = 5_000;

/**
 * Pauses every Worker of this process while PostgreSQL or Redis is down, and resumes them
 * when both answer again. Tripped by a job that failed with a dependency error; it then
 * polls the dependencies itself, so no job is taken (and failed) just to find out.
 */
class DependencyGuard {
  private tripped = false;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly services: Services,
    private readonly workers: Worker[],
  ) {}

  get down(): boolean {
    return this.tripped;
  }

  trip(): void {
    if (this.tripped || this.stopped) return;
    this.tripped = true;
    this.services.logger.warn('a dependency is down: workers stop taking jobs until PostgreSQL and Redis answer');
    for (const worker of this.workers) void worker.pause(true).catch(() => {});
    this.schedule(POLL_FIRST_MS);
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => void this.poll(delayMs), delayMs);
  }

  private async poll(lastDelayMs: number): Promise<void> {
    const status = await dependencyStatus(this.services);
    if (this.stopped) return;
    const down = downDependencies(status);
    if (down.length > 0) {
      this.services.logger.debug({ down }, 'dependency still down');
      this.schedule(Math.min(lastDelayMs * 2, POLL_MAX_MS));
      return;
    }
    this.tripped = false;
    this.services.logger.info('PostgreSQL and Redis answer again: workers resume');
    for (const worker of this.workers) worker.resume();
  }
}

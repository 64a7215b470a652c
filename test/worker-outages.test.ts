import { DelayedError, type Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/shared/config.js';
import { closeServices, createServices, type Services } from '../src/shared/container.js';
import { createLogger } from '../src/shared/logger.js';
import { createRedis } from '../src/shared/redis.js';
import { startMetricsServer, type MetricsServer } from '../src/workers/metrics-server.js';
import { defineProcessor, startWorkers, type QueueProcessor, type RunningWorkers } from '../src/workers/runner.js';
import { createTestEnv, type TestEnv } from './helpers/context.js';
import { TcpProxy, TestRedis, waitFor } from './helpers/outages.js';

// Workers stop taking jobs while PostgreSQL or Redis is down and resume when it returns;
// a job that failed only because a dependency was down keeps its attempts (one attempt
// here, so spending it would fail the job). Real outages: this file's own redis-server and
// a TCP proxy in front of the machine's PostgreSQL.

let env: TestEnv;
let redis: TestRedis;
let pgProxy: TcpProxy;
let services: Services;
let running: RunningWorkers;
let metricsServer: MetricsServer;
let queue: Queue;

/** What the test processor saw: every run, and the runs that finished. */
const runs: string[] = [];
const done: string[] = [];
/** Jobs whose first run waits here until the test opens it. */
const gates = new Map<string, { promise: Promise<void>; open(): void }>();

function gate(jobId: string): () => void {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  gates.set(jobId, { promise, open });
  return open;
}

// The processor of a test: it needs both PostgreSQL (its fork) and Redis (the fail-fast
// connection), as every real processor does.
const testProcessor = defineProcessor({
  queue: 'maintenance',
  concurrency: 2,
  handlers: {
    'purge-expired': async (_payload, ctx) => {
      const id = String(ctx.job.id);
      runs.push(id);
      // Puts itself back once to wait, as a campaign's completion check does.
      if (id.startsWith('poll-') && runs.filter((r) => r === id).length === 1 && ctx.job.token) {
        await ctx.job.moveToDelayed(Date.now() + 50, ctx.job.token);
        throw new DelayedError();
      }
      const waiting = gates.get(id);
      if (waiting) {
        gates.delete(id);
        await waiting.promise;
      }
      await ctx.em.execute('select 1');
      await ctx.services.redis.ping();
      done.push(id);
      return { ok: true };
    },
  },
});

beforeAll(async () => {
  redis = await TestRedis.start();
  env = await createTestEnv({ REDIS_URL: redis.url });
  const pg = new URL(env.config.databaseUrl);
  pgProxy = await TcpProxy.start(pg.hostname, Number(pg.port || 5432));
  pg.hostname = '127.0.0.1';
  pg.port = String(pgProxy.port);
  const config = loadConfig({ ...env.env, DATABASE_URL: pg.toString() });
  services = await createServices(config, createLogger({ level: 'silent' }));
  running = await startWorkers(services, createRedis(config.redisUrl, 'worker'), [testProcessor as QueueProcessor]);
  metricsServer = await startMetricsServer(services, 0, () => running.paused);
  queue = services.producer.queue('maintenance');
});

afterAll(async () => {
  for (const g of gates.values()) g.open();
  await metricsServer?.close();
  await running?.close();
  if (services) await closeServices(services);
  await env?.dispose();
  await redis?.dispose();
  await pgProxy?.cut();
});

async function state(jobId: string): Promise<string> {
  return queue.getJobState(jobId);
}

async function workerMetrics(): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${metricsServer.port}/metrics`);
  expect(res.status).toBe(200);
  return res.text();
}

describe('worker process metrics (WORKER_METRICS_PORT)', () => {
  it('counts completed jobs by queue with a duration histogram', async () => {
    await queue.add('purge-expired', {}, { jobId: 'plain-1' });
    await waitFor('plain-1 completed', async () => (await state('plain-1')) === 'completed');
    const body = await workerMetrics();
    expect(body).toMatch(/^mailroom_jobs_completed_total\{queue="maintenance"\} [1-9]/m);
    expect(body).toMatch(/^mailroom_job_duration_seconds_count\{queue="maintenance",outcome="completed"\} [1-9]/m);
    expect(body).toMatch(/^mailroom_worker_paused\{queue="maintenance"\} 0$/m);
    expect(body).toMatch(/^mailroom_queue_jobs\{queue="maintenance",state="waiting"\} \d+$/m);
  });

  it('serves /healthz and /readyz, and nothing else', async () => {
    const base = `http://127.0.0.1:${metricsServer.port}`;
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    const ready = await fetch(`${base}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toMatchObject({ status: 'ready', checks: { postgres: 'up', redis: 'up' } });
    const missing = await fetch(`${base}/api/v2/tokens`);
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { name: string }).name).toBe('not_found');
    // Without ADMIN_PASSWORD, /metrics is this host's only: not a client a proxy on it forwards.
    expect((await fetch(`${base}/metrics`)).status).toBe(200);
    expect((await fetch(`${base}/metrics`, { headers: { 'x-forwarded-for': '203.0.113.9' } })).status).toBe(403);
  });

  it('counts a job that puts itself back to wait neither as failed nor as completed until it completes', async () => {
    const failed = () => workerMetrics().then((body) => Number(/^mailroom_jobs_failed_total\{queue="maintenance"\} (\d+)/m.exec(body)?.[1] ?? 0));
    const before = await failed();
    await queue.add('purge-expired', {}, { jobId: 'poll-1' });
    await waitFor('poll-1 completed', async () => (await state('poll-1')) === 'completed');
    expect(runs.filter((r) => r === 'poll-1')).toHaveLength(2);
    expect(await failed()).toBe(before);
  });

  it('counts failed attempts by queue', async () => {
    // A job no handler knows, added behind the typed producer's back (as an older release might).
    await queue.add('no-such-job', {}, { jobId: 'unknown-name', attempts: 1 });
    await waitFor('unknown-name failed', async () => (await state('unknown-name')) === 'failed');
    expect(await workerMetrics()).toMatch(/^mailroom_jobs_failed_total\{queue="maintenance"\} [1-9]/m);
  });
});

describe('PostgreSQL goes away', () => {
  it('pauses the workers without spending the job its attempt, and resumes when it returns', async () => {
    await pgProxy.cut();
    await queue.add('purge-expired', {}, { jobId: 'pg-down-1', attempts: 1 });
    await waitFor('the workers to pause', () => running.paused);
    expect(runs).toContain('pg-down-1');

    // Paused: the job waits (delayed or waiting), not failed, and is not run again and again.
    const runsWhilePaused = runs.filter((id) => id === 'pg-down-1').length;
    await queue.add('purge-expired', {}, { jobId: 'pg-down-2', attempts: 1 });
    await new Promise((r) => setTimeout(r, 1_500));
    expect(['delayed', 'waiting']).toContain(await state('pg-down-1'));
    expect(['delayed', 'waiting']).toContain(await state('pg-down-2'));
    expect(runs.filter((id) => id === 'pg-down-1').length).toBe(runsWhilePaused);
    expect(runs).not.toContain('pg-down-2');
    const body = await workerMetrics();
    expect(body).toMatch(/^mailroom_worker_paused\{queue="maintenance"\} 1$/m);
    expect(body).toMatch(/^mailroom_jobs_deferred_total\{queue="maintenance"\} [1-9]/m);
    const ready = await fetch(`http://127.0.0.1:${metricsServer.port}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { checks: { postgres: string } }).checks.postgres).toBe('down');

    await pgProxy.restore();
    await waitFor('pg-down-1 completed', async () => (await state('pg-down-1')) === 'completed', 15_000);
    await waitFor('pg-down-2 completed', async () => (await state('pg-down-2')) === 'completed', 15_000);
    expect(running.paused).toBe(false);
    expect(done.filter((id) => id.startsWith('pg-down')).sort()).toEqual(['pg-down-1', 'pg-down-2']);
    expect(await workerMetrics()).toMatch(/^mailroom_worker_paused\{queue="maintenance"\} 0$/m);
  });
});

describe('Redis goes away', () => {
  it('puts the running job back once Redis returns, without spending its attempt, and resumes', async () => {
    const open = gate('redis-down-1');
    await queue.add('purge-expired', {}, { jobId: 'redis-down-1', attempts: 1 });
    await waitFor('redis-down-1 to start', () => runs.includes('redis-down-1'));

    // Redis stops (its data written to disk first, as a restart of a persistent Redis).
    await redis.stop('save');
    open();
    await waitFor('the workers to pause', () => running.paused);

    await redis.start();
    await waitFor('redis-down-1 completed', async () => (await state('redis-down-1')) === 'completed', 15_000);
    const job = await queue.getJob('redis-down-1');
    expect(job?.failedReason).toBeFalsy();
    expect(done.filter((id) => id === 'redis-down-1')).toEqual(['redis-down-1']);
    await waitFor('the workers to resume', () => !running.paused);

    // And the queue is served as before.
    await queue.add('purge-expired', {}, { jobId: 'after-redis' });
    await waitFor('after-redis completed', async () => (await state('after-redis')) === 'completed');
  });
});

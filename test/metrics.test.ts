import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMetrics } from '../src/shared/metrics.js';
import { QUEUE_NAMES } from '../src/shared/queues/registry.js';
import { startWorkerProcess } from '../src/workers/main.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { sample } from './helpers/ops-metrics.js';
import { freePort } from './helpers/outages.js';

describe('GET /metrics (docs/operations.md "Metrics")', () => {
  let ctx: TestContext;
  let token: string;

  beforeAll(async () => {
    ctx = await createTestContext();
    ({ token } = await createOrg(ctx.services));
  });
  afterAll(async () => ctx?.close());

  async function scrape(): Promise<string> {
    const res = await ctx.app.inject({ url: '/metrics' });
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
    return res.body;
  }

  it('counts requests by route pattern and status with a latency histogram', async () => {
    for (let i = 0; i < 3; i++) await ctx.app.inject({ url: '/healthz' });
    await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(token) });
    await ctx.app.inject({ url: '/api/v2/tokens' });
    await ctx.app.inject({ url: '/no/such/route/eml_123' });
    // Answered before routing: bad percent-encoding, an id past the path length limit.
    await ctx.app.inject({ url: '/api/v2/emails/%FF' });
    await ctx.app.inject({ url: `/api/v2/emails/${'a'.repeat(3_000)}` });
    const body = await scrape();

    const healthz = { method: 'GET', route: '/healthz', status_code: '200' };
    expect(sample(body, 'mailroom_http_requests_total', healthz)).toBeGreaterThanOrEqual(3);
    expect(sample(body, 'mailroom_http_request_duration_seconds_count', healthz)).toBeGreaterThanOrEqual(3);
    expect(sample(body, 'mailroom_http_request_duration_seconds_bucket', { ...healthz, le: '+Inf' })).toBeGreaterThanOrEqual(3);
    expect(sample(body, 'mailroom_http_request_duration_seconds_sum', healthz)).toBeGreaterThan(0);
    expect(sample(body, 'mailroom_http_requests_total', { route: '/api/v2/tokens', status_code: '200' })).toBe(1);
    expect(sample(body, 'mailroom_http_requests_total', { route: '/api/v2/tokens', status_code: '401' })).toBe(1);
    // Unknown URLs share one series: the raw URL never becomes a label.
    expect(sample(body, 'mailroom_http_requests_total', { route: 'unmatched', status_code: '404' })).toBe(3);
    expect(body).not.toContain('eml_123');
  });

  it('counts a v1 call and a tool call once, not their v2 dispatches again', async () => {
    const tags = { method: 'GET', route: '/api/v2/tags', status_code: '200' };
    const campaigns = { method: 'GET', route: '/api/v2/campaigns', status_code: '200' };
    let body = await scrape();
    const before = { tags: sample(body, 'mailroom_http_requests_total', tags) ?? 0, campaigns: sample(body, 'mailroom_http_requests_total', campaigns) ?? 0 };
    expect((await ctx.app.inject({ url: '/api/v1/tags', headers: bearer(token) })).statusCode).toBe(200);
    expect((await ctx.app.inject({ method: 'POST', url: '/api/v2/tools/list_campaigns', headers: bearer(token), payload: {} })).statusCode).toBe(200);
    body = await scrape();
    expect(sample(body, 'mailroom_http_requests_total', { route: '/api/v1/tags', status_code: '200' })).toBe(1);
    expect(sample(body, 'mailroom_http_requests_total', { route: '/api/v2/tools/:name', status_code: '200' })).toBe(1);
    expect(sample(body, 'mailroom_http_requests_total', tags) ?? 0).toBe(before.tags);
    expect(sample(body, 'mailroom_http_requests_total', campaigns) ?? 0).toBe(before.campaigns);
    // A client's own v2 request is counted.
    await ctx.app.inject({ url: '/api/v2/tags', headers: bearer(token) });
    expect(sample(await scrape(), 'mailroom_http_requests_total', tags)).toBe(before.tags + 1);
  });

  it('reports jobs per queue and state for every queue of the registry', async () => {
    const queue = ctx.services.producer.queue('maintenance');
    await queue.add('purge-expired', {}, { jobId: 'metrics-waiting-1' });
    await queue.add('purge-expired', {}, { jobId: 'metrics-waiting-2' });
    await queue.add('purge-expired', {}, { jobId: 'metrics-delayed', delay: 60_000 });
    const body = await scrape();
    for (const name of QUEUE_NAMES) {
      for (const state of ['waiting', 'active', 'delayed', 'failed']) {
        expect(sample(body, 'mailroom_queue_jobs', { queue: name, state }), `${name} ${state}`).toBeDefined();
      }
    }
    expect(sample(body, 'mailroom_queue_jobs', { queue: 'maintenance', state: 'waiting' })).toBe(2);
    expect(sample(body, 'mailroom_queue_jobs', { queue: 'maintenance', state: 'delayed' })).toBe(1);
  });

  it('declares every business counter before anything is recorded, so dashboards can be written now', async () => {
    // That they move with the real actions is tested in metrics-truth.test.ts.
    const body = await scrape();
    for (const name of [
      'mailroom_emails_accepted_total',
      'mailroom_emails_sent_total',
      'mailroom_emails_delivered_total',
      'mailroom_emails_bounced_total',
      'mailroom_emails_failed_total',
      'mailroom_emails_complained_total',
      'mailroom_verification_checks_total',
      'mailroom_dns_cache_hits_total',
      'mailroom_dns_cache_misses_total',
      'mailroom_campaign_recipients_queued_total',
    ]) {
      expect(body).toContain(`# TYPE ${name} counter`);
    }
    expect(sample(body, 'process_resident_memory_bytes')).toBeGreaterThan(0);
  });

  it('reports emails by status from PostgreSQL once an emails table exists, and nothing before', async () => {
    const connection = ctx.services.orm.em.fork().getConnection();
    const hasTable = (await connection.execute(`select to_regclass('emails') as t`))[0].t !== null;
    if (!hasTable) {
      expect(sample(await scrape(), 'mailroom_emails', {})).toBeUndefined();
      // What the emails feature will create, reduced to the column this gauge reads.
      await connection.execute(`create table emails (id text primary key, status text not null)`);
    }
    await connection.execute(`insert into emails (id, status) values ('eml_m1', 'queued'), ('eml_m2', 'sent'), ('eml_m3', 'sent')`).catch(() => {
      // The real table has more required columns: counting whatever rows exist is enough then.
    });
    const rows = await connection.execute<Array<{ status: string; count: string }>>('select status, count(*) as count from emails group by status');
    // A fresh registry: the gauge caches its query for 30 s.
    const fresh = createMetrics({ producer: ctx.services.producer, orm: ctx.services.orm, logger: ctx.services.logger });
    const body = await fresh.registry.metrics();
    for (const row of rows) expect(sample(body, 'mailroom_emails', { status: row.status })).toBe(Number(row.count));
    // Campaigns by status, by the same mechanism (SENDING = fan-outs under way).
    expect(body).toContain('# TYPE mailroom_campaigns gauge');
    if (!hasTable) {
      expect(sample(body, 'mailroom_emails', { status: 'sent' })).toBe(2);
      await connection.execute('drop table emails');
    }
  });

  it('is not an OpenAPI operation', async () => {
    const doc = (await ctx.app.inject({ url: '/api/v2/openapi.json' })).json();
    expect(Object.keys(doc.paths).filter((p) => p.startsWith('/metrics') || p.startsWith('/admin'))).toEqual([]);
  });
});

describe('GET /metrics with ADMIN_PASSWORD set', () => {
  let ctx: TestContext;
  beforeAll(async () => {
    ctx = await createTestContext({ ADMIN_PASSWORD: 'metrics-secret' });
  });
  afterAll(async () => ctx?.close());

  it('asks the operator basic auth, like the dashboard', async () => {
    const none = await ctx.app.inject({ url: '/metrics' });
    expect(none.statusCode).toBe(401);
    expect(none.headers['www-authenticate']).toMatch(/^Basic /);
    const wrong = await ctx.app.inject({ url: '/metrics', headers: { authorization: `Basic ${Buffer.from('admin:nope').toString('base64')}` } });
    expect(wrong.statusCode).toBe(401);
    const right = await ctx.app.inject({ url: '/metrics', headers: { authorization: `Basic ${Buffer.from('admin:metrics-secret').toString('base64')}` } });
    expect(right.statusCode).toBe(200);
    expect(right.body).toContain('mailroom_queue_jobs');
  });
});

describe('worker process metrics on WORKER_METRICS_PORT', () => {
  let ctx: TestContext;
  let worker: Awaited<ReturnType<typeof startWorkerProcess>>;
  let port: number;

  beforeAll(async () => {
    port = await freePort();
    ctx = await createTestContext({ WORKER_METRICS_PORT: String(port), ADMIN_PASSWORD: 'worker-secret' });
    worker = await startWorkerProcess(ctx.services);
  });
  afterAll(async () => {
    await worker?.close();
    await ctx?.close();
  });

  it('is served by the worker process on its own port, with the operator credentials', async () => {
    expect(worker.metricsServer?.port).toBe(port);
    const anonymous = await fetch(`http://127.0.0.1:${port}/metrics`);
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('www-authenticate')).toMatch(/^Basic /);
    const res = await fetch(`http://127.0.0.1:${port}/metrics`, { headers: { authorization: `Basic ${Buffer.from('admin:worker-secret').toString('base64')}` } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/plain/);
    const body = await res.text();
    expect(sample(body, 'mailroom_worker_paused', { queue: 'maintenance' })).toBe(0);
    expect(body).toContain('# TYPE mailroom_jobs_completed_total counter');
    expect(body).toContain('# TYPE mailroom_job_duration_seconds histogram');
  });

  it('is not started without WORKER_METRICS_PORT', async () => {
    const other = await startWorkerProcess({ ...ctx.services, config: { ...ctx.services.config, workerMetricsPort: undefined } });
    try {
      expect(other.metricsServer).toBeUndefined();
    } finally {
      await other.close();
    }
  });
});

import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Orm } from './db/orm.js';
import { countByStatus, hasStatusColumn } from './db/queries.js';
import type { Logger } from './logger.js';
import type { QueueProducer } from './queues/producer.js';
import { QUEUE_NAMES } from './queues/registry.js';

/**
 * The Prometheus metrics of one process (API, worker, or both under `npm start`), made once
 * by createServices and reached as `services.metrics`. Every metric lives in this process's
 * own Registry, never prom-client's global one, so nothing is registered as a side effect of
 * an import and tests may build several. Names and labels are listed in docs/operations.md.
 *
 * Features record their business events through the typed fields below, e.g.
 * `services.metrics.emailsAccepted.inc()` or
 * `services.metrics.verificationChecks.inc({ result: 'deliverable' })`.
 */
export interface Metrics {
  registry: Registry;
  /**
   * The registry's text for a scrape. Concurrent scrapes share one collection: each
   * collection reads Redis and may count rows in PostgreSQL, so N scrapers at once must
   * not cost N times that.
   */
  scrape(): Promise<string>;

  // HTTP (API processes), recorded by the onResponse hook of src/api/plugins/metrics.ts.
  httpRequests: Counter<'method' | 'route' | 'status_code'>;
  httpRequestDuration: Histogram<'method' | 'route' | 'status_code'>;

  // Emails: one increment per email (a batch of 10 is inc(10)).
  /** Accepted by the API or written by a campaign fan-out. `source`: api | campaign | test. */
  emailsAccepted: Counter<'source'>;
  /** Handed to the provider (the relay accepted it). */
  emailsSent: Counter<'source'>;
  /** Reported delivered by the transport or a provider event. */
  emailsDelivered: Counter<never>;
  /** Reported bounced. `type`: hard | soft. */
  emailsBounced: Counter<'type'>;
  /** Reported as spam by the recipient. */
  emailsComplained: Counter<never>;
  /** Given up on (suppressed, rejected by the relay, out of attempts). `reason`: a short code. */
  emailsFailed: Counter<'reason'>;
  /**
   * Bounce and complaint reports by mail (docs/outcomes.md). `outcome`: applied (an effect),
   * duplicate (a replay: nothing new), unmatched (no email of the return path's organization),
   * refused (refused by the listener, or read and found to be no report to act on).
   */
  inboundReports: Counter<'outcome'>;

  // Campaigns.
  /** Recipients written (one email row each) by campaign fan-out. */
  campaignRecipientsQueued: Counter<never>;
  /** Campaigns that reached a final state. `status`: sent | failed | cancelled. */
  campaignsFinished: Counter<'status'>;

  // Verification and DNS.
  /** Address checks answered. `result`: deliverable | undeliverable | risky | unknown. */
  verificationChecks: Counter<'result'>;
  /** Lookups answered by the Redis DNS cache. `type`: the record type (mx, txt, a, ...). */
  dnsCacheHits: Counter<'type'>;
  /** Lookups that went to a DNS server. `type`: the record type. */
  dnsCacheMisses: Counter<'type'>;

  // Workers, recorded by src/workers/runner.ts.
  jobsCompleted: Counter<'queue'>;
  jobsFailed: Counter<'queue'>;
  /** Jobs put back (not failed, attempt not counted) because PostgreSQL or Redis was down. */
  jobsDeferred: Counter<'queue'>;
  jobDuration: Histogram<'queue' | 'outcome'>;
  /** 1 while this process's worker of the queue is paused because a dependency is down. */
  workerPaused: Gauge<'queue'>;
}

export interface MetricsSources {
  producer: QueueProducer;
  orm: Orm;
  logger: Logger;
}

// Buckets in seconds: API answers sit in the milliseconds, jobs (render + SMTP) in seconds.
const HTTP_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const JOB_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];

// A scrape never waits on a dependency longer than this; the gauge is left empty instead.
const COLLECT_TIMEOUT_MS = 2_000;
// GROUP BY over the emails table is a scan: run it at most this often per process, and cap it.
const STATUS_QUERY_INTERVAL_MS = 30_000;
const STATUS_QUERY_TIMEOUT_MS = 2_000;

const QUEUE_STATES = ['waiting', 'active', 'delayed', 'failed', 'prioritized', 'paused'] as const;

export function createMetrics(sources: MetricsSources): Metrics {
  const registry = new Registry();
  // The standard process_* and nodejs_* series, unprefixed so stock Node.js dashboards work.
  collectDefaultMetrics({ register: registry });
  const registers = [registry];

  const counter = <L extends string>(name: string, help: string, labelNames: readonly L[] = []) =>
    new Counter<L>({ name, help, labelNames, registers });

  let inFlight: Promise<string> | undefined;
  const metrics: Metrics = {
    registry,
    scrape() {
      inFlight ??= registry.metrics().finally(() => {
        inFlight = undefined;
      });
      return inFlight;
    },
    httpRequests: counter('mailroom_http_requests_total', 'HTTP requests answered, by route pattern and status', ['method', 'route', 'status_code']),
    httpRequestDuration: new Histogram({
      name: 'mailroom_http_request_duration_seconds',
      help: 'Time to answer an HTTP request, by route pattern and status',
      labelNames: ['method', 'route', 'status_code'],
      buckets: HTTP_BUCKETS,
      registers,
    }),
    emailsAccepted: counter('mailroom_emails_accepted_total', 'Emails accepted for sending', ['source']),
    emailsSent: counter('mailroom_emails_sent_total', 'Emails handed to the provider', ['source']),
    emailsDelivered: counter('mailroom_emails_delivered_total', 'Emails reported delivered'),
    emailsBounced: counter('mailroom_emails_bounced_total', 'Emails reported bounced', ['type']),
    emailsComplained: counter('mailroom_emails_complained_total', 'Emails reported as spam by the recipient'),
    emailsFailed: counter('mailroom_emails_failed_total', 'Emails given up on', ['reason']),
    inboundReports: counter('mailroom_inbound_reports_total', 'Bounce and complaint reports received by mail, by outcome', ['outcome']),
    campaignRecipientsQueued: counter('mailroom_campaign_recipients_queued_total', 'Campaign recipients written by fan-out'),
    campaignsFinished: counter('mailroom_campaigns_finished_total', 'Campaigns that reached a final state', ['status']),
    verificationChecks: counter('mailroom_verification_checks_total', 'Address verification checks answered', ['result']),
    dnsCacheHits: counter('mailroom_dns_cache_hits_total', 'DNS lookups answered by the cache', ['type']),
    dnsCacheMisses: counter('mailroom_dns_cache_misses_total', 'DNS lookups sent to a DNS server', ['type']),
    jobsCompleted: counter('mailroom_jobs_completed_total', 'Jobs completed by this process', ['queue']),
    jobsFailed: counter('mailroom_jobs_failed_total', 'Job attempts failed in this process', ['queue']),
    jobsDeferred: counter('mailroom_jobs_deferred_total', 'Jobs put back because PostgreSQL or Redis was down', ['queue']),
    jobDuration: new Histogram({
      name: 'mailroom_job_duration_seconds',
      help: 'Time to process a job in this process, by queue and outcome',
      labelNames: ['queue', 'outcome'],
      buckets: JOB_BUCKETS,
      registers,
    }),
    workerPaused: new Gauge({
      name: 'mailroom_worker_paused',
      help: '1 while this process stopped taking jobs of the queue because a dependency is down',
      labelNames: ['queue'],
      registers,
    }),
  };

  registerQueueGauge(registry, sources);
  registerStatusGauge(registry, sources, 'emails', 'Emails by status, read from PostgreSQL (at most every 30 s per process)');
  // SENDING is the number of campaigns whose fan-out is under way.
  registerStatusGauge(registry, sources, 'campaigns', 'Campaigns by status, read from PostgreSQL (at most every 30 s per process)');
  return metrics;
}

/** Jobs per queue and state, read from Redis at scrape time (the same for every process). */
function registerQueueGauge(registry: Registry, { producer, logger }: MetricsSources): void {
  new Gauge({
    name: 'mailroom_queue_jobs',
    help: 'Jobs in each queue by state (waiting is the queue depth), read from Redis at scrape time',
    labelNames: ['queue', 'state'],
    registers: [registry],
    async collect() {
      this.reset();
      try {
        const all = await withTimeout(
          Promise.all(QUEUE_NAMES.map(async (name) => [name, await producer.queue(name).getJobCounts(...QUEUE_STATES)] as const)),
          COLLECT_TIMEOUT_MS,
        );
        for (const [queue, counts] of all) {
          for (const state of QUEUE_STATES) this.set({ queue, state }, counts[state] ?? 0);
        }
      } catch (error) {
        // Redis is down: no sample rather than a stale one or a failed scrape.
        logger.debug({ err: error }, 'metrics: queue counts unavailable');
      }
    },
  });
}

/**
 * Rows of a feature's table by their `status` column, once the feature has created the
 * table; no sample before. Cached for STATUS_QUERY_INTERVAL_MS and capped by a statement
 * timeout, because a GROUP BY over a large table (emails) is not free.
 */
function registerStatusGauge(registry: Registry, { orm, logger }: MetricsSources, table: 'emails' | 'campaigns', help: string): void {
  let tableReady = false;
  let last: { at: number; rows: Array<{ status: string; count: string | number }> } | undefined;

  async function query(): Promise<Array<{ status: string; count: string | number }>> {
    if (!tableReady) {
      tableReady = await hasStatusColumn(orm.em.fork(), table);
      if (!tableReady) return [];
    }
    // `table` is one of two constants, never input.
    return countByStatus(orm.em.fork(), table, STATUS_QUERY_TIMEOUT_MS);
  }

  new Gauge({
    name: `mailroom_${table}`,
    help,
    labelNames: ['status'],
    registers: [registry],
    async collect() {
      const now = Date.now();
      if (!last || now - last.at >= STATUS_QUERY_INTERVAL_MS) {
        try {
          // Concurrent scrapes share one collection (Metrics.scrape), so one query at a time.
          last = { at: now, rows: await withTimeout(query(), COLLECT_TIMEOUT_MS + STATUS_QUERY_TIMEOUT_MS) };
        } catch (error) {
          logger.debug({ err: error, table }, 'metrics: rows by status unavailable');
          last = undefined;
          this.reset();
          return;
        }
      }
      this.reset();
      for (const row of last.rows) this.set({ status: row.status }, Number(row.count));
    },
  });
}

async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

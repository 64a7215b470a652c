import type { Redis } from 'ioredis';
import pLimit, { type LimitFunction } from 'p-limit';
import { ReturnPaths, returnPathHost } from './bounces/return-path.js';
import type { Config } from './config.js';
import { LinkSigner, SecretBox } from './crypto.js';
import { initOrm, type Orm } from './db/orm.js';
import { createDns, type DnsService } from './dns/resolver.js';
import { DkimKeyCache, dkimOptionsFor } from './domains/dkim.js';
import { DeliveryStore } from './emails/deliver.js';
import { HandoverFence } from './emails/handover.js';
import { offLoop } from './emails/off-loop.js';
import { RenderPool } from './emails/render-pool.js';
import { EmailWriter } from './emails/service.js';
import { createMailTransport, type MailTransport } from './emails/transport.js';
import type { Logger } from './logger.js';
import { createMetrics, type Metrics } from './metrics.js';
import { TrackingRecorder } from './outcomes/recorder.js';
import { SendGate } from './outcomes/send-gate.js';
import { QueueProducer } from './queues/producer.js';
import { organizationRateLimiter, tokenRateLimiter, type WindowRateLimiter } from './rate-limits/window.js';
import { SnsCertificates } from './providers/sns.js';
import { createRedis, disconnectRedis, settleConnection } from './redis.js';
import { TokenListCache } from './tokens/list-cache.js';
import { TokenCache } from './tokens/token-cache.js';
import { LocalRoutingCache } from './verification/routing.js';
import { VerificationStore } from './verification/store.js';
import { WebhookClient } from './webhooks/dispatcher.js';

/**
 * The infrastructure of one process, made once at start-up and passed down
 * (docs/architecture.md "Processes"). Nothing in the service connects to anything as a side effect
 * of an import.
 */
export interface Services {
  config: Config;
  logger: Logger;
  orm: Orm;
  /** Fail-fast connection for the API, the producer, caches and rate limits. */
  redis: Redis;
  producer: QueueProducer;
  box: SecretBox;
  signer: LinkSigner;
  clock: () => Date;
  /** Redis-cached DNS (DNS_SERVERS); `dns.fresh` bypasses the cache. */
  dns: DnsService;
  /** This process's Prometheus registry and the counters features record into. */
  metrics: Metrics;
  /** The mail transport (file or pooled SMTP); it connects on its first send. */
  mailer: MailTransport;
  /** Worker threads that render for the API (security: never on the API's event loop). */
  render: RenderPool;
  /** Threads that render and build the mail this process delivers (DELIVERY_THREADS; none at 0). */
  deliveryThreads?: RenderPool;
  /** RATE_LIMIT_ORG_PER_SECOND per organization, for every interface of this process. */
  orgLimiter: WindowRateLimiter;
  /** Signs and verifies the per-email return paths (bounces by mail, docs/outcomes.md "The return path (VERP)"). */
  returnPaths: ReturnPaths;
  /** Amazon SNS signing certificates fetched for the SES webhook, cached by URL. */
  snsCertificates: SnsCertificates;

  // The process's state (caches, batchers, pools): here and nowhere else, so that tests and
  // two apps in one process never share it (test/architecture-state.test.ts). Those with a
  // cost are made on first read (an API process never makes the delivery store, a worker
  // never the token cache) and stopped by closeServices. A copy (`{ ...services, config }`)
  // shares the original's, made with the original's configuration.
  /** DKIM options by (organization, domain), for the mailer's signing. */
  readonly dkimKeys: DkimKeyCache;
  /** Tracking of the HTML handed over, and the count of suppressed emails. */
  readonly sendGate: SendGate;
  /** The send path's claims and group commits (emails/deliver.ts). */
  readonly deliveryStore: DeliveryStore;
  /** The API's email writes, coalesced into few statements (emails/service.ts). */
  readonly emailWriter: EmailWriter;
  /** Open and click hits, written in batches a few milliseconds after the answer. */
  readonly trackingRecorder: TrackingRecorder;
  /** Token lookups by secret, for the HTTP API and SMTP submission (subscribed to token changes). */
  readonly tokenCache: TokenCache;
  /** Organizations' token lists between writes (subscribed to token changes). */
  readonly tokenListCache: TokenListCache;
  /** RATE_LIMIT_PER_SECOND per token, for every interface of this process. */
  readonly tokenLimiter: WindowRateLimiter;
  /** What address verification keeps between calls (verification/index.ts). */
  readonly verification: VerificationState;
  /** Webhook deliveries' HTTP client and its per-endpoint connection pools. */
  readonly webhookClient: WebhookClient;
  /** The `send-batch` expansions running at once (workers/emails.ts says why few). */
  readonly sendBatchExpansions: LimitFunction;
  /** Stops what of the state above was made (closeServices calls it first). */
  closeState(): Promise<void>;
}

export interface VerificationState {
  blocked: ReadonlySet<string>;
  /** Batches statements across concurrent verifications, on a fork used only for raw statements. */
  store: VerificationStore;
  localRouting: LocalRoutingCache;
}

// A campaign's fan-out brings a hundred batches at once; each expansion queues thousands of
// job additions on the producer's connection.
const SEND_BATCH_EXPANSIONS = 4;
// Messages a delivery thread is given before it answered the first: enough to keep it busy
// while answers travel back (a worker runs up to 100 send jobs at once).
const DELIVERY_TASKS_PER_THREAD = 32;

export async function createServices(config: Config, logger: Logger): Promise<Services> {
  const orm = await initOrm({ databaseUrl: config.databaseUrl, logger, namedStatements: config.databasePreparedStatements });
  const redis = createRedis(config.redisUrl, 'producer');
  redis.on('error', (error) => logger.debug({ err: error }, 'redis connection error'));
  // The producer connection refuses commands until it is ready (fail fast): without this
  // wait the first requests after start-up, and /readyz, would answer 503.
  if (!(await settleConnection(redis))) logger.warn('Redis is not reachable yet: requests that need it answer 503 until it is');
  const producer = new QueueProducer(redis, config.redisPrefix);
  const box = new SecretBox(config.secretKey);
  const returnPaths = new ReturnPaths(config.secretKey);
  const metrics = createMetrics({ producer, orm, logger });
  const dkimKeys = new DkimKeyCache();
  const signer = new LinkSigner(config.secretKey);
  // Started on the first message a process delivers, stopped after a minute without one. Its
  // queue needs no bound of its own: the send jobs running at once bound it.
  const deliveryThreads = config.mail.threads > 0 ? new RenderPool({ threads: config.mail.threads, tasksPerThread: DELIVERY_TASKS_PER_THREAD, timeoutMs: 60_000, maxQueue: Infinity }) : undefined;
  const delivery = offLoop(deliveryThreads, logger);
  const sendGate = new SendGate({ publicUrl: config.publicUrl, signer, onSuppressed: () => metrics.emailsFailed.inc({ reason: 'suppressed' }) });

  // Made on first read, then kept; what has to be stopped is stopped by closeServices, in order.
  const made = new Map<string, unknown>();
  const stops: (() => Promise<void> | void)[] = [];
  function once<T>(name: string, make: () => T, stop?: (value: T) => Promise<void> | void): T {
    if (made.has(name)) return made.get(name) as T;
    const value = make();
    made.set(name, value);
    if (stop) stops.push(() => stop(value));
    return value;
  }

  const services: Services = {
    config,
    logger,
    orm,
    redis,
    producer,
    box,
    signer,
    clock: () => new Date(),
    dns: await createDns(redis, config, { logger, metrics }),
    metrics,
    mailer: createMailTransport(config.mail, {
      compose: delivery.compose,
      // Mail from a domain of the organization is signed with that domain's key
      // (docs/domains.md "DKIM signing").
      // A process that signs hears of added and deleted domains from its first signature on.
      dkim: async (fromDomain, organizationId) => {
        void dkimKeys.start({ redis, config, logger });
        return (await dkimOptionsFor(() => orm.em.fork(), box, organizationId, fromDomain, dkimKeys)) ?? undefined;
      },
      // VERP: bounces come back to a per-email address (docs/outcomes.md).
      returnPath: (emailId, fromDomain, ownDomain) => returnPaths.address(emailId, returnPathHost(fromDomain, ownDomain, config.inbound.bounceDomain)),
      logger,
    }),
    render: new RenderPool({ threads: 2, timeoutMs: 30_000 }),
    ...(deliveryThreads ? { deliveryThreads } : {}),
    orgLimiter: organizationRateLimiter({ redis, config }),
    returnPaths,
    snsCertificates: new SnsCertificates(),
    dkimKeys,
    sendGate,
    tokenLimiter: tokenRateLimiter({ redis, config }),
    sendBatchExpansions: pLimit(SEND_BATCH_EXPANSIONS),
    get deliveryStore() {
      return once('deliveryStore', () => new DeliveryStore(orm, new HandoverFence(redis, config.redisPrefix), sendGate, { signer, publicUrl: config.publicUrl }, delivery.render));
    },
    get emailWriter() {
      return once('emailWriter', () => new EmailWriter(orm, { producer, logger }));
    },
    get trackingRecorder() {
      // Its close writes the last hits (before closeServices closes PostgreSQL).
      return once('trackingRecorder', () => new TrackingRecorder(orm, logger), (recorder) => recorder.close());
    },
    get tokenCache() {
      return once(
        'tokenCache',
        () => {
          const cache = new TokenCache();
          cache.start({ redis, config, logger });
          return cache;
        },
        (cache) => cache.close(),
      );
    },
    get tokenListCache() {
      return once(
        'tokenListCache',
        () => {
          const cache = new TokenListCache({ redis, config, logger });
          cache.start();
          return cache;
        },
        (cache) => cache.close(),
      );
    },
    get verification() {
      return once('verification', () => ({
        blocked: new Set(config.verifyBlockedDomains),
        store: VerificationStore.forEntityManager(orm.em.fork()),
        localRouting: new LocalRoutingCache(),
      }));
    },
    async closeState() {
      for (const stop of stops.splice(0)) await stop();
    },
    get webhookClient() {
      // Uncached DNS: the address connected to is the one just checked (ssrf.ts).
      return once('webhookClient', () => new WebhookClient({ dns: services.dns.fresh, allowPrivateUrls: config.webhookAllowPrivateUrls }), (client) => client.close());
    },
  };
  return services;
}

export async function closeServices(services: Services): Promise<void> {
  await services.closeState().catch((error: unknown) => services.logger.warn({ err: error }, 'process state did not stop cleanly'));
  // The connection before the queues: a queue still waiting for its first connection (Redis
  // unreachable at start) fails that wait when the connection ends, and BullMQ reports it on
  // the queue's connection. A queue closed first has left it without a listener, and a stop
  // during such an attempt ended the process on an unhandled rejection (exit 1, not 0).
  await disconnectRedis(services.redis);
  await services.producer.close().catch(() => {});
  services.dkimKeys.close();
  services.mailer.close();
  await services.render.close().catch(() => {});
  await services.deliveryThreads?.close().catch(() => {});
  await services.orm.close(true);
}

/** Redis key of the service: every key goes through here so REDIS_PREFIX holds. */
export function redisKey(config: Pick<Config, 'redisPrefix'>, ...parts: string[]): string {
  return [config.redisPrefix, ...parts].join(':');
}

import type { Redis } from 'ioredis';
import { ReturnPaths, returnPathHost } from './bounces/return-path.js';
import type { Config } from './config.js';
import { LinkSigner, SecretBox } from './crypto.js';
import { initOrm, type Orm } from './db/orm.js';
import { createDns, type DnsService } from './dns/resolver.js';
import { dkimOptionsFor } from './domains/dkim.js';
import { RenderPool } from './emails/render-pool.js';
import { createMailTransport, type MailTransport } from './emails/transport.js';
import type { Logger } from './logger.js';
import { createMetrics, type Metrics } from './metrics.js';
import { QueueProducer } from './queues/producer.js';
import { organizationRateLimiter, type WindowRateLimiter } from './rate-limits/window.js';
import { SnsCertificates } from './providers/sns.js';
import { createRedis, settleConnection } from './redis.js';

/**
 * The infrastructure of one process, made once at start-up and passed down (STYLE 4).
 * Nothing in the service connects to anything as a side effect of an import.
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
  /** RATE_LIMIT_ORG_PER_SECOND per organization, for every interface of this process. */
  orgLimiter: WindowRateLimiter;
  /** Signs and verifies the per-email return paths (bounces by mail, contract 18a). */
  returnPaths: ReturnPaths;
  /** Amazon SNS signing certificates fetched for the SES webhook, cached by URL. */
  snsCertificates: SnsCertificates;
}

export async function createServices(config: Config, logger: Logger): Promise<Services> {
  const orm = await initOrm({ databaseUrl: config.databaseUrl, logger });
  const redis = createRedis(config.redisUrl, 'producer');
  redis.on('error', (error) => logger.debug({ err: error }, 'redis connection error'));
  // The producer connection refuses commands until it is ready (fail fast): without this
  // wait the first requests after start-up, and /readyz, would answer 503.
  if (!(await settleConnection(redis))) logger.warn('Redis is not reachable yet: requests that need it answer 503 until it is');
  const producer = new QueueProducer(redis, config.redisPrefix);
  const box = new SecretBox(config.secretKey);
  const returnPaths = new ReturnPaths(config.secretKey);
  const metrics = createMetrics({ producer, orm, logger });
  return {
    config,
    logger,
    orm,
    redis,
    producer,
    box,
    signer: new LinkSigner(config.secretKey),
    clock: () => new Date(),
    dns: await createDns(redis, config, { logger, metrics }),
    metrics,
    mailer: createMailTransport(config.mail, {
      // Mail from a domain of the organization is signed with that domain's key (contract 11).
      dkim: async (fromDomain, organizationId) => (await dkimOptionsFor(() => orm.em.fork(), box, organizationId, fromDomain)) ?? undefined,
      // VERP: bounces come back to a per-email address (docs/outcomes.md).
      returnPath: (emailId, fromDomain, ownDomain) => returnPaths.address(emailId, returnPathHost(fromDomain, ownDomain, config.inbound.bounceDomain)),
    }),
    render: new RenderPool({ threads: 2, timeoutMs: 30_000 }),
    orgLimiter: organizationRateLimiter({ redis, config }),
    returnPaths,
    snsCertificates: new SnsCertificates(),
  };
}

export async function closeServices(services: Services): Promise<void> {
  await services.producer.close().catch(() => {});
  services.redis.disconnect();
  services.mailer.close();
  await services.render.close().catch(() => {});
  await services.orm.close(true);
}

/** Redis key of the service: every key goes through here so REDIS_PREFIX holds. */
export function redisKey(config: Pick<Config, 'redisPrefix'>, ...parts: string[]): string {
  return [config.redisPrefix, ...parts].join(':');
}

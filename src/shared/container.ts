import type { Redis } from 'ioredis';
import type { Config } from './config.js';
import { LinkSigner, SecretBox } from './crypto.js';
import { initOrm, type Orm } from './db/orm.js';
import type { Logger } from './logger.js';
import { QueueProducer } from './queues/producer.js';
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
}

export async function createServices(config: Config, logger: Logger): Promise<Services> {
  const orm = await initOrm({ databaseUrl: config.databaseUrl, logger });
  const redis = createRedis(config.redisUrl, 'producer');
  redis.on('error', (error) => logger.debug({ err: error }, 'redis connection error'));
  // The producer connection refuses commands until it is ready (fail fast): without this
  // wait the first requests after start-up, and /readyz, would answer 503.
  if (!(await settleConnection(redis))) logger.warn('Redis is not reachable yet: requests that need it answer 503 until it is');
  return {
    config,
    logger,
    orm,
    redis,
    producer: new QueueProducer(redis, config.redisPrefix),
    box: new SecretBox(config.secretKey),
    signer: new LinkSigner(config.secretKey),
    clock: () => new Date(),
  };
}

export async function closeServices(services: Services): Promise<void> {
  await services.producer.close().catch(() => {});
  services.redis.disconnect();
  await services.orm.close(true);
}

/** Redis key of the service: every key goes through here so REDIS_PREFIX holds. */
export function redisKey(config: Pick<Config, 'redisPrefix'>, ...parts: string[]): string {
  return [config.redisPrefix, ...parts].join(':');
}

import { randomBytes } from 'node:crypto';
import { buildApp } from '../../src/api/app.js';
import type { App } from '../../src/api/types.js';
import { loadConfig, type Config } from '../../src/shared/config.js';
import { closeServices, createServices, type Services } from '../../src/shared/container.js';
import { createLogger } from '../../src/shared/logger.js';
import { createOrganization } from '../../src/shared/organizations/service.js';
import { createRedis, waitForRedis } from '../../src/shared/redis.js';
import { adminQuery, databaseUrl, dropDatabase, templateName } from './database.js';

export interface TestEnv {
  /** Environment for a child process of the service that shares this test's data. */
  env: Record<string, string>;
  config: Config;
  dbName: string;
  dispose(): Promise<void>;
}

/**
 * A database copied from the migrated template and a Redis prefix, both of this test file
 * alone. `overrides` are environment variables as the service reads them.
 */
export async function createTestEnv(overrides: Record<string, string> = {}): Promise<TestEnv> {
  const suffix = randomBytes(5).toString('hex');
  const dbName = `mailroom_test_${suffix}`;
  await adminQuery(`create database "${dbName}" template "${templateName()}"`);
  const env: Record<string, string> = {
    NODE_ENV: 'test',
    DATABASE_URL: databaseUrl(dbName),
    REDIS_URL: process.env.REDIS_URL || 'redis://127.0.0.1:6379',
    REDIS_PREFIX: `mrtest-${suffix}`,
    SECRET_KEY: 'test-secret-key-test-secret-key-0123456789',
    LOG_LEVEL: 'silent',
    RATE_LIMIT_PER_SECOND: '10000',
    MAIL_OUTBOX_DIR: `/tmp/mailroom-test-${suffix}/outbox`,
    // A child `npm start` of a test listens for bounces on a port of its own.
    INBOUND_SMTP_PORT: '0',
    // `npm start` also listens for SMTP submission: never on a fixed port in tests.
    SMTP_SUBMISSION_PORT: '0',
    ...overrides,
  };
  const config = loadConfig(env);
  return {
    env,
    config,
    dbName,
    async dispose() {
      await dropDatabase(dbName);
      await deleteRedisPrefix(config);
    },
  };
}

async function deleteRedisPrefix(config: Config): Promise<void> {
  const redis = createRedis(config.redisUrl, 'worker');
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${config.redisPrefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length) await redis.del(...keys);
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
}

export interface TestContext {
  env: TestEnv;
  services: Services;
  app: App;
  close(): Promise<void>;
}

/** Services and an app (not listening: use `app.inject`) on this file's own data. */
export async function createTestContext(overrides: Record<string, string> = {}): Promise<TestContext> {
  const env = await createTestEnv(overrides);
  const services = await createServices(env.config, createLogger({ level: env.config.logLevel }));
  // The API's Redis connection fails fast until it is connected: wait, so the first
  // request of a test is not answered 503.
  await waitForRedis(services.redis);
  const app = await buildApp(services);
  await app.ready();
  return {
    env,
    services,
    app,
    async close() {
      await app.close();
      await closeServices(services);
      await env.dispose();
    },
  };
}

/** A new organization and its `*` token. */
export async function createOrg(services: Services, options: { name?: string; doubleOptIn?: boolean; verifyQuota?: number } = {}) {
  const created = await createOrganization(services.orm.em.fork(), services.box, {
    name: options.name ?? 'Acme',
    doubleOptIn: options.doubleOptIn,
    verifyQuota: options.verifyQuota ?? services.config.verifyMonthlyQuota,
  });
  return { organizationId: created.organization.id, token: created.token.token };
}

export function bearer(token: string): Record<string, string> {
  return { authorization: `Bearer ${token}` };
}

import { createServer, type AddressInfo, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/api/app.js';
import type { App } from '../src/api/types.js';
import { loadConfig } from '../src/shared/config.js';
import { closeServices, createServices, type Services } from '../src/shared/container.js';
import { createLogger } from '../src/shared/logger.js';
import { bearer, createOrg, createTestEnv, type TestEnv } from './helpers/context.js';
import { TcpProxy, TestRedis, waitFor } from './helpers/outages.js';
import { openDialog } from './helpers/smtp-dialog.js';
import { startSubmission } from '../src/smtp/server.js';

// docs/operations.md "When PostgreSQL or Redis goes away": while PostgreSQL or Redis is unreachable
// the API answers 503 service_unavailable quickly (never a hang, never a 500), /readyz names what
// is down, and everything recovers by itself when the dependency returns. Real outages: a
// redis-server of this file's own, and a TCP proxy in front of the machine's PostgreSQL.

let env: TestEnv;
let redis: TestRedis;
let pgProxy: TcpProxy;
let services: Services;
let app: App;
let token: string;

beforeAll(async () => {
  redis = await TestRedis.start();
  env = await createTestEnv({ REDIS_URL: redis.url });
  const pg = new URL(env.config.databaseUrl);
  pgProxy = await TcpProxy.start(pg.hostname, Number(pg.port || 5432));
  pg.hostname = '127.0.0.1';
  pg.port = String(pgProxy.port);
  // The app reaches PostgreSQL only through the proxy; the test's own setup goes direct.
  const config = loadConfig({ ...env.env, DATABASE_URL: pg.toString() });
  services = await createServices(config, createLogger({ level: 'silent' }));
  app = await buildApp(services);
  await app.ready();
  ({ token } = await createOrg(services));
});

afterAll(async () => {
  await app?.close();
  if (services) await closeServices(services);
  await env?.dispose();
  await redis?.dispose();
  await pgProxy?.cut();
});

/** A request with its duration; it must never take long, whatever is down. */
async function timed(url: string, headers: Record<string, string> = {}) {
  const started = Date.now();
  const res = await app.inject({ url, headers });
  return { res, ms: Date.now() - started };
}

async function expectHealthy(): Promise<void> {
  await waitFor('readyz 200', async () => (await app.inject({ url: '/readyz' })).statusCode === 200, 10_000);
  await waitFor('API 200', async () => (await app.inject({ url: '/api/v2/domains', headers: bearer(token) })).statusCode === 200, 10_000);
}

/** Past the rate limiter's current window, so the next request must ask Redis. */
function nextRateLimitWindow(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 1_100 - (Date.now() % 1_000)));
}

function expectUnavailable(res: Awaited<ReturnType<typeof timed>>['res']): void {
  expect(res.statusCode).toBe(503);
  expect(res.headers['retry-after']).toBeDefined();
  expect(res.json()).toMatchObject({ name: 'service_unavailable', statusCode: 503 });
  expect(res.body).not.toMatch(/ECONNREFUSED|stack|at .*\.js/);
}

describe('Redis goes away', () => {
  it('answers 503 at once while it is down, and recovers by itself', async () => {
    await expectHealthy();
    await redis.stop('kill');

    const ready = await timed('/readyz');
    expect(ready.ms).toBeLessThan(2_500);
    expectUnavailable(ready.res);
    expect(ready.res.json()).toMatchObject({ message: 'Unavailable: redis', checks: { postgres: 'up', redis: 'down' } });

    // An authenticated call needs Redis for its rate limit, once the part of the current
    // one-second window this process reserved is spent (src/api/plugins/auth.ts).
    await nextRateLimitWindow();
    const api = await timed('/api/v2/domains', bearer(token));
    expect(api.ms).toBeLessThan(2_500);
    expectUnavailable(api.res);
    // Liveness does not depend on Redis.
    expect((await app.inject({ url: '/healthz' })).statusCode).toBe(200);

    await redis.start();
    await expectHealthy();
  });

  it('answers 503 within seconds while it hangs (no reply at all), and recovers', async () => {
    await expectHealthy();
    redis.freeze(true);
    try {
      await nextRateLimitWindow();
      const [ready, api] = await Promise.all([timed('/readyz'), timed('/api/v2/domains', bearer(token))]);
      expect(ready.ms).toBeLessThan(4_000);
      expectUnavailable(ready.res);
      expect(ready.res.json().checks).toEqual({ postgres: 'up', redis: 'down' });
      expect(api.ms).toBeLessThan(5_000);
      expectUnavailable(api.res);
    } finally {
      redis.freeze(false);
    }
    await expectHealthy();
  });
});

describe('PostgreSQL goes away', () => {
  it('answers 503 at once while its port is closed, and recovers by itself', async () => {
    await expectHealthy();
    await pgProxy.cut();

    const ready = await timed('/readyz');
    expect(ready.ms).toBeLessThan(2_500);
    expectUnavailable(ready.res);
    expect(ready.res.json()).toMatchObject({ message: 'Unavailable: postgres', checks: { postgres: 'down', redis: 'up' } });

    // A token already known to this process: the route itself needs the database.
    const known = await timed('/api/v2/domains', bearer(token));
    expect(known.ms).toBeLessThan(4_000);
    expectUnavailable(known.res);
    // A token never seen: authentication itself needs the database. Not a 401.
    const unknown = await timed('/api/v2/domains', bearer(`svc_${'1'.repeat(64)}`));
    expect(unknown.ms).toBeLessThan(4_000);
    expectUnavailable(unknown.res);

    await pgProxy.restore();
    await expectHealthy();
  });

  it('answers SMTP AUTH of a token never seen with 454 while it is gone (docs/smtp.md)', async () => {
    const listener = await startSubmission(services, { closeTimeoutMs: 200 });
    try {
      await expectHealthy();
      await pgProxy.cut();
      const dialog = await openDialog(listener.port);
      await dialog.send('EHLO client.test');
      expect(await dialog.auth(`svc_${'2'.repeat(64)}`)).toMatch(/^454 4\.7\.0 /);
      dialog.close();
    } finally {
      await pgProxy.restore();
      await listener.close();
    }
    await expectHealthy();
  });

  it('answers 503 after the connect timeout when its host takes connections and never answers', async () => {
    // A process of its own, started while the host hangs (no earlier failure known to it).
    await pgProxy.cut();
    await pgProxy.hang();
    const pg = new URL(env.config.databaseUrl);
    pg.hostname = '127.0.0.1';
    pg.port = String(pgProxy.port);
    const hungServices = await createServices(loadConfig({ ...env.env, DATABASE_URL: pg.toString() }), createLogger({ level: 'silent' }));
    const hungApp = await buildApp(hungServices);
    try {
      await hungApp.ready();
      const started = Date.now();
      const res = await hungApp.inject({ url: '/api/v2/domains', headers: bearer(token) });
      expect(Date.now() - started).toBeLessThan(6_000);
      expectUnavailable(res);
    } finally {
      await hungApp.close();
      await pgProxy.cut();
      await closeServices(hungServices);
      await pgProxy.restore();
    }
    await expectHealthy();
  });
});

describe('a process stopped while Redis is unreachable', () => {
  it('closes without an unhandled rejection when a queue still waits for a connection attempt under way', async () => {
    // A port that refuses connections, then a Redis that accepts one and never answers: the
    // queue made meanwhile waits for its first connection, and an attempt is under way when
    // the process closes (SIGTERM during start-up, Redis down).
    const refusing = createServer();
    await new Promise<void>((resolve) => refusing.listen(0, '127.0.0.1', () => resolve()));
    const port = (refusing.address() as AddressInfo).port;
    await new Promise((resolve) => refusing.close(resolve));
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => void unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    const sockets: Socket[] = [];
    const silent = createServer((socket) => {
      sockets.push(socket);
      socket.resume();
    });
    try {
      const down = await createServices(loadConfig({ ...env.env, REDIS_URL: `redis://127.0.0.1:${port}` }), createLogger({ level: 'silent' }));
      down.producer.queue('emails');
      await new Promise((resolve) => down.redis.once('error', resolve));
      await new Promise<void>((resolve) => silent.listen(port, '127.0.0.1', () => resolve()));
      await waitFor('a connection attempt under way', async () => down.redis.status === 'connect', 10_000);
      await closeServices(down);
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      for (const socket of sockets) socket.destroy();
      silent.close();
    }
  });
});

import { Redis, type RedisOptions } from 'ioredis';
import type { Logger } from './logger.js';

// How long the fail-fast connection waits for a reply before the command fails (then 503).
const PRODUCER_COMMAND_TIMEOUT_MS = 3_000;

/**
 * Two kinds of connection (docs/operations.md "When PostgreSQL or Redis goes away"):
 * - `producer` (API, CLI): fails fast while Redis is down, so a request is answered 503
 *   instead of waiting in an offline queue;
 * - `worker` (BullMQ workers and their blocking reads): retries every command and
 *   reconnects forever.
 */
export function createRedis(url: string, role: 'producer' | 'worker'): Redis {
  const common: RedisOptions = {
    connectTimeout: 3_000,
    retryStrategy: (attempt) => Math.min(attempt * 200, 2_000),
    lazyConnect: false,
  };
  const options: RedisOptions =
    role === 'producer'
      ? // commandTimeout: a Redis that accepts the connection but answers nothing (a hung
        // host, a full network buffer) is a 503 after this long, not a request that hangs.
        // No auto-pipelining: the hand-over fence (emails/handover.ts) relies on its `dot:`
        // record being written to the socket in the turn that releases the final `.`;
        // auto-pipelining defers it to a later turn (a SIGKILL in between sent emails twice).
        { ...common, enableOfflineQueue: false, maxRetriesPerRequest: 1, commandTimeout: PRODUCER_COMMAND_TIMEOUT_MS }
      : { ...common, enableOfflineQueue: true, maxRetriesPerRequest: null };
  return new Redis(url, options);
}

/** Resolves once the connection is ready, or rejects after `timeoutMs`. */
export async function waitForRedis(redis: Redis, timeoutMs = 5_000): Promise<void> {
  if (redis.status === 'ready') return;
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`Redis did not answer within ${timeoutMs} ms`));
    }, timeoutMs);
    const onReady = () => {
      cleanup();
      resolve();
    };
    const cleanup = () => {
      clearTimeout(timer);
      redis.off('ready', onReady);
    };
    redis.on('ready', onReady);
  });
}

// How long a closing process waits for its connection's end (Redis answers a FIN at once).
const DISCONNECT_WAIT_MS = 1_000;

/**
 * Disconnects, and when a socket was open or opening waits for the connection's end and one
 * turn of the event loop after it: what waits on the connection (a BullMQ queue still waiting
 * for its first connection) is told, and has run its handlers, before its owner is closed and
 * stops listening. Without a socket (never connected, between two attempts) nothing ends and
 * nothing is told.
 */
export async function disconnectRedis(redis: Redis): Promise<void> {
  const open = redis.status === 'connecting' || redis.status === 'connect' || redis.status === 'ready';
  const ended = open
    ? new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, DISCONNECT_WAIT_MS);
        redis.once('end', () => {
          clearTimeout(timer);
          // The promise chains the end settles are microtasks: all run before this.
          setImmediate(resolve);
        });
      })
    : Promise.resolve();
  redis.disconnect();
  await ended;
}

/**
 * Resolves once the first connection attempt has settled, ready or failed (at most
 * `timeoutMs`): true when ready. A process waits for this before serving, so its first
 * requests are not refused merely because the socket is still connecting, and it still
 * starts (answering 503) while Redis is down.
 */
export async function settleConnection(redis: Redis, timeoutMs = 3_000): Promise<boolean> {
  if (redis.status === 'ready') return true;
  return new Promise<boolean>((resolve) => {
    const done = (ready: boolean) => {
      clearTimeout(timer);
      redis.off('ready', onReady);
      redis.off('error', onError);
      resolve(ready);
    };
    const onReady = () => done(true);
    const onError = () => done(false);
    const timer = setTimeout(() => done(false), timeoutMs);
    redis.on('ready', onReady);
    redis.on('error', onError);
  });
}

/**
 * Listens to one announcement channel (PUBLISH) on a connection of its own, for a process's
 * caches. `up` once the subscription holds; `down` when the connection closes, as
 * announcements may then be missed (no automatic resubscription: the next `ready` subscribes
 * again); `message` with each announcement's text (an organization id).
 */
export function subscribeAnnouncements(
  services: { redis: Redis; logger: Pick<Logger, 'debug'> },
  channel: string,
  what: string,
  on: { up?(): void; down(): void; message(text: string): void },
): Redis {
  const subscriber = services.redis.duplicate({ autoResubscribe: false, commandTimeout: undefined });
  subscriber.on('error', (error) => services.logger.debug({ err: error }, `${what} subscriber error`));
  subscriber.on('ready', () => {
    subscriber.subscribe(channel).then(
      () => on.up?.(),
      () => {},
    );
  });
  subscriber.on('close', () => on.down());
  subscriber.on('message', (_channel: string, text: string) => on.message(text));
  return subscriber;
}

/** Publishes an announcement; resolves false (never throws) when Redis is down. */
export async function announce(redis: Redis, channel: string, text: string): Promise<boolean> {
  try {
    await redis.publish(channel, text);
    return true;
  } catch {
    return false;
  }
}

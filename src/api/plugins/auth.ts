import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Redis } from 'ioredis';
import { redisKey, type Services } from '../../shared/container.js';
import { AppError, AuthenticationError, PermissionError } from '../../shared/errors.js';
import { holds } from '../../shared/tokens/permissions.js';
import { tokenChangesChannel } from '../../shared/tokens/revoke.js';
import { findTokenBySecret, type Caller } from '../../shared/tokens/service.js';

// A token is read from PostgreSQL at most once per this long per process, so the hot path
// of an authenticated request costs one in-memory lookup (issue: auth >= 60% of /healthz).
// A revoked token stops working sooner: see TokenCache.
const CACHE_TTL_MS = 30_000;
const NEGATIVE_TTL_MS = 2_000;
const CACHE_MAX = 10_000;

interface CacheEntry {
  caller: Caller | null;
  expiresAt: number;
}

/**
 * Secrets already looked up by this process. A revocation (contract 16: refused by every
 * API process within 2 s) is announced on the token-change channel with the organization
 * id; every process drops that organization's entries when the message arrives, which
 * takes milliseconds. The cache is only trusted while this process's subscription is up:
 * with the subscriber disconnected an announcement could be missed, so every request then
 * reads PostgreSQL, and the entries are dropped. A lookup that began before an
 * announcement never stores its (possibly revoked) result.
 */
export class TokenCache {
  private readonly entries = new Map<string, CacheEntry>();
  private generation = 0;
  private subscriber: Redis | undefined;
  private subscribed = false;

  /** Subscribes to token-change announcements; the cache stays unused until that succeeds. */
  start(services: Services): void {
    const channel = tokenChangesChannel(services.config);
    const subscriber = services.redis.duplicate({ autoResubscribe: false, commandTimeout: undefined });
    subscriber.on('error', (error) => services.logger.debug({ err: error }, 'token cache subscriber error'));
    subscriber.on('ready', () => {
      subscriber.subscribe(channel).then(
        () => {
          this.subscribed = true;
        },
        () => {},
      );
    });
    subscriber.on('close', () => {
      this.subscribed = false;
      this.clear();
    });
    subscriber.on('message', (_channel: string, organizationId: string) => this.forgetOrganization(organizationId));
    this.subscriber = subscriber;
  }

  close(): void {
    this.subscriber?.disconnect();
    this.subscriber = undefined;
    this.subscribed = false;
    this.clear();
  }

  /** The generation to hand back to set(): a change announced in between voids the store. */
  get current(): number {
    return this.generation;
  }

  get(secret: string, now: number): CacheEntry | undefined {
    if (!this.subscribed) return undefined;
    const entry = this.entries.get(secret);
    if (entry && entry.expiresAt > now) return entry;
    if (entry) this.entries.delete(secret);
    return undefined;
  }

  set(secret: string, caller: Caller | null, now: number, generation = this.generation): void {
    if (!this.subscribed || generation !== this.generation) return;
    if (this.entries.size >= CACHE_MAX) {
      // Maps iterate in insertion order: drop the oldest entry.
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(secret, { caller, expiresAt: now + (caller ? CACHE_TTL_MS : NEGATIVE_TTL_MS) });
  }

  /** A token of the organization was minted or revoked. */
  forgetOrganization(organizationId: string): void {
    this.generation += 1;
    for (const [secret, entry] of this.entries) {
      if (entry.caller?.organizationId === organizationId) this.entries.delete(secret);
    }
  }

  clear(): void {
    this.generation += 1;
    this.entries.clear();
  }
}

function bearer(request: FastifyRequest): string | undefined {
  const header = request.headers.authorization;
  if (!header) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

export async function authenticate(services: Services, cache: TokenCache, request: FastifyRequest): Promise<Caller> {
  const secret = bearer(request);
  if (!secret) throw new AuthenticationError();
  const now = Date.now();
  let entry = cache.get(secret, now);
  if (!entry) {
    const generation = cache.current;
    const token = await findTokenBySecret(request.em, secret);
    const caller = token ? { organizationId: token.organizationId, tokenId: token.id, permissions: token.permissions } : null;
    cache.set(secret, caller, now, generation);
    entry = { caller, expiresAt: 0 };
  }
  if (!entry.caller) throw new AuthenticationError('Missing or invalid API key', 'invalid_token');
  return entry.caller;
}

// A process reserves at most this share of what is left of a token's window per Redis
// round trip, and at most LEASE_MAX requests (see RateLimiter).
const LEASE_FRACTION = 0.1;
const LEASE_MAX = 100;

interface RateWindow {
  second: number;
  /** Requests of this window reserved in Redis by this process, and spent of them. */
  granted: number;
  used: number;
  /** The window's count in Redis (every process) after this process's last reservation. */
  total: number;
  /** The limit is reached: refuse without asking Redis until the next second. */
  full: boolean;
  pending?: Promise<void>;
}

export interface RateDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  resetSeconds: number;
}

/**
 * Per-token fixed one-second window in Redis, shared by every API process (contract 5).
 *
 * Asking Redis on every request made the rate limit the main cost of an authenticated
 * request (bench/README.md). Instead a process reserves several requests of the window at
 * once (INCRBY n, one round trip shared by the concurrent requests of that token) and
 * spends them locally. n is at most a tenth of what is left of the limit, so a small limit
 * (and the last tenth of any limit) is still counted request by request, exactly. With
 * several processes a token can only be refused slightly early, never late: another
 * process may hold an unspent part of its reservation.
 */
export class RateLimiter {
  private readonly windows = new Map<string, RateWindow>();
  private sweptAt = 0;

  constructor(private readonly services: Services) {}

  async take(tokenId: string, nowMs = Date.now()): Promise<RateDecision> {
    const limit = this.services.config.rateLimitPerSecond;
    const second = Math.floor(nowMs / 1000);
    const resetSeconds = Math.max(1, Math.ceil(((second + 1) * 1000 - nowMs) / 1000));
    if (second !== this.sweptAt) this.sweep(second);
    let window = this.windows.get(tokenId);
    if (!window || window.second !== second) {
      window = { second, granted: 0, used: 0, total: 0, full: false };
      this.windows.set(tokenId, window);
    }
    while (window.used >= window.granted) {
      if (window.full) return { allowed: false, limit, remaining: 0, resetSeconds };
      const current = window;
      current.pending ??= this.reserve(tokenId, current, limit).finally(() => {
        current.pending = undefined;
      });
      await current.pending;
    }
    window.used += 1;
    const spentEverywhere = window.total - (window.granted - window.used);
    return { allowed: true, limit, remaining: Math.max(0, limit - spentEverywhere), resetSeconds };
  }

  private async reserve(tokenId: string, window: RateWindow, limit: number): Promise<void> {
    const wanted = Math.max(1, Math.min(LEASE_MAX, Math.floor((limit - window.total) * LEASE_FRACTION)));
    const key = redisKey(this.services.config, 'rl', tokenId, String(window.second));
    const result = await this.services.redis.multi().incrby(key, wanted).expire(key, 2).exec();
    if (result?.[0]?.[0]) throw result[0][0];
    const total = Number(result?.[0]?.[1] ?? 0);
    const granted = Math.max(0, Math.min(wanted, limit - (total - wanted)));
    window.granted += granted;
    window.total = total;
    if (total >= limit) window.full = true;
  }

  /** Forgets the windows of past seconds, once a second. */
  private sweep(second: number): void {
    for (const [tokenId, window] of this.windows) if (window.second < second) this.windows.delete(tokenId);
    this.sweptAt = second;
  }
}

export async function rateLimit(limiter: RateLimiter, caller: Caller, reply: FastifyReply): Promise<void> {
  const decision = await limiter.take(caller.tokenId);
  void reply.header('RateLimit-Limit', String(decision.limit));
  void reply.header('RateLimit-Remaining', String(decision.remaining));
  void reply.header('RateLimit-Reset', String(decision.resetSeconds));
  if (!decision.allowed) {
    void reply.header('Retry-After', String(decision.resetSeconds));
    throw new AppError(
      429,
      'rate_limit_exceeded',
      `More than ${decision.limit} requests a second with this token; retry after ${decision.resetSeconds} s`,
    );
  }
}

/** onRequest hook of every authenticated scope: token, then rate limit, then permission. */
export function authHook(services: Services, cache: TokenCache, limiter: RateLimiter) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    request.caller = await authenticate(services, cache, request);
    await rateLimit(limiter, request.caller, reply);
    const permission = request.routeOptions.config?.permission;
    if (permission && !holds(request.caller.permissions, permission)) {
      throw new PermissionError(
        `This token lacks the "${permission}" permission`,
        request.routeOptions.config.permissionErrorName ?? 'missing_permission',
      );
    }
  };
}

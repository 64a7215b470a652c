import type { EntityManager } from '@mikro-orm/postgresql';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Redis } from 'ioredis';
import type { Services } from '../../shared/container.js';
import { WindowRateLimiter } from '../../shared/rate-limits/window.js';
import { AppError, AuthenticationError, PermissionError } from '../../shared/errors.js';
import { holds } from '../../shared/tokens/permissions.js';
import { tokenChangesChannel } from '../../shared/tokens/revoke.js';
import { findTokenBySecret, type Caller } from '../../shared/tokens/service.js';
import { isDispatched } from '../tools/dispatch.js';

export type { RateDecision } from '../../shared/rate-limits/window.js';

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
 * Secrets already looked up by this process, kept apart by answer: valid tokens (30 s) and
 * unknown secrets (2 s). Anyone can send well-formed random `svc_...` secrets; with one map
 * they evicted the valid entries and every real request went back to the database. Unknown
 * secrets now only evict each other.
 *
 * A revocation (refused by every process within 2 s, docs/foundation.md) is announced on the
 * token-change channel with the organization id; every process drops that organization's
 * entries when the message arrives, which takes milliseconds. The cache is only trusted
 * while this process's subscription is up: with the subscriber disconnected an announcement
 * could be missed, so every request then reads PostgreSQL, and the entries are dropped. A
 * lookup that began before an announcement never stores its (possibly revoked) result.
 */
export class TokenCache {
  private readonly valid = new Map<string, CacheEntry>();
  private readonly unknown = new Map<string, CacheEntry>();
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

  /** True while the subscription is up, the only time the cache is used. */
  get active(): boolean {
    return this.subscribed;
  }

  /** The generation to hand back to set(): a change announced in between voids the store. */
  get current(): number {
    return this.generation;
  }

  get(secret: string, now: number): CacheEntry | undefined {
    if (!this.subscribed) return undefined;
    for (const entries of [this.valid, this.unknown]) {
      const entry = entries.get(secret);
      if (entry && entry.expiresAt > now) return entry;
      if (entry) entries.delete(secret);
    }
    return undefined;
  }

  set(secret: string, caller: Caller | null, now: number, generation = this.generation): void {
    if (!this.subscribed || generation !== this.generation) return;
    const entries = caller ? this.valid : this.unknown;
    if (entries.size >= CACHE_MAX) {
      // Maps iterate in insertion order: drop the oldest entry.
      const oldest = entries.keys().next().value;
      if (oldest !== undefined) entries.delete(oldest);
    }
    entries.set(secret, { caller, expiresAt: now + (caller ? CACHE_TTL_MS : NEGATIVE_TTL_MS) });
  }

  /** A token of the organization was minted or revoked. */
  forgetOrganization(organizationId: string): void {
    this.generation += 1;
    for (const [secret, entry] of this.valid) {
      if (entry.caller?.organizationId === organizationId) this.valid.delete(secret);
    }
  }

  clear(): void {
    this.generation += 1;
    this.valid.clear();
    this.unknown.clear();
  }
}

function bearer(request: FastifyRequest): string | undefined {
  const header = request.headers.authorization;
  if (!header) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

/**
 * The token a secret belongs to, through the process's cache; null when there is none.
 * The one lookup of every way in with a token (HTTP API, SMTP submission).
 */
export async function callerForSecret(em: EntityManager, cache: TokenCache, secret: string): Promise<Caller | null> {
  const now = Date.now();
  const entry = cache.get(secret, now);
  if (entry) return entry.caller;
  const generation = cache.current;
  const token = await findTokenBySecret(em, secret);
  const caller = token ? { organizationId: token.organizationId, tokenId: token.id, permissions: token.permissions } : null;
  cache.set(secret, caller, now, generation);
  return caller;
}

export async function authenticate(services: Services, cache: TokenCache, request: FastifyRequest): Promise<Caller> {
  const secret = bearer(request);
  if (!secret) throw new AuthenticationError();
  const caller = await callerForSecret(request.em, cache, secret);
  if (!caller) throw new AuthenticationError('Missing or invalid API key', 'invalid_token');
  return caller;
}

/** The per-token limiter (contract 5): RATE_LIMIT_PER_SECOND per token, shared by every API process. */
export class RateLimiter extends WindowRateLimiter {
  constructor(services: Pick<Services, 'redis' | 'config'>) {
    super(services, { scope: 'rl', limit: services.config.rateLimitPerSecond });
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

/**
 * One request of the caller's organization against RATE_LIMIT_ORG_PER_SECOND. Counted once
 * per request that reaches the service from outside: by the v2 hook, and by the layers that
 * dispatch (tools, MCP, v1) before they dispatch, so a call they refuse themselves counts
 * too; the v2 request they dispatch is not counted again (isDispatched).
 */
export async function limitOrganization(services: Pick<Services, 'orgLimiter'>, caller: Caller, reply: FastifyReply): Promise<void> {
  const decision = await services.orgLimiter.take(caller.organizationId);
  if (decision.allowed) return;
  void reply.header('Retry-After', String(decision.resetSeconds));
  throw new AppError(
    429,
    'rate_limit_exceeded',
    `More than ${decision.limit} requests a second for this organization; retry after ${decision.resetSeconds} s`,
  );
}

/** onRequest hook of every authenticated scope: token, then rate limits, then permission. */
export function authHook(services: Services, cache: TokenCache, limiter: RateLimiter) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    request.caller = await authenticate(services, cache, request);
    if (!isDispatched(request)) await limitOrganization(services, request.caller, reply);
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

import type { FastifyReply, FastifyRequest } from 'fastify';
import { redisKey, type Services } from '../../shared/container.js';
import { AppError, AuthenticationError, PermissionError } from '../../shared/errors.js';
import { holds } from '../../shared/tokens/permissions.js';
import { findTokenBySecret, type Caller } from '../../shared/tokens/service.js';

// A token is read from PostgreSQL at most once per this long per process, so the hot path
// of an authenticated request costs one in-memory lookup (issue: auth >= 60% of /healthz).
const CACHE_TTL_MS = 30_000;
const NEGATIVE_TTL_MS = 2_000;
const CACHE_MAX = 10_000;

interface CacheEntry {
  caller: Caller | null;
  expiresAt: number;
}

export class TokenCache {
  private readonly entries = new Map<string, CacheEntry>();

  get(secret: string, now: number): CacheEntry | undefined {
    const entry = this.entries.get(secret);
    if (entry && entry.expiresAt > now) return entry;
    if (entry) this.entries.delete(secret);
    return undefined;
  }

  set(secret: string, caller: Caller | null, now: number): void {
    if (this.entries.size >= CACHE_MAX) {
      // Maps iterate in insertion order: drop the oldest entry.
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(secret, { caller, expiresAt: now + (caller ? CACHE_TTL_MS : NEGATIVE_TTL_MS) });
  }

  clear(): void {
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
    const token = await findTokenBySecret(request.em, secret);
    const caller = token ? { organizationId: token.organizationId, tokenId: token.id, permissions: token.permissions } : null;
    cache.set(secret, caller, now);
    entry = { caller, expiresAt: 0 };
  }
  if (!entry.caller) throw new AuthenticationError();
  return entry.caller;
}

/**
 * Per-token fixed one-second window in Redis, shared by every API process (contract 5).
 * One round trip: INCR and EXPIRE in a MULTI.
 */
export async function rateLimit(services: Services, caller: Caller, reply: FastifyReply): Promise<void> {
  const limit = services.config.rateLimitPerSecond;
  const nowMs = Date.now();
  const second = Math.floor(nowMs / 1000);
  const key = redisKey(services.config, 'rl', caller.tokenId, String(second));
  const result = await services.redis.multi().incr(key).expire(key, 2).exec();
  const count = Number(result?.[0]?.[1] ?? 0);
  if (result?.[0]?.[0]) throw result[0][0];
  const reset = Math.max(1, Math.ceil((second + 1) * 1000 - nowMs) / 1000);
  void reply.header('RateLimit-Limit', String(limit));
  void reply.header('RateLimit-Remaining', String(Math.max(0, limit - count)));
  void reply.header('RateLimit-Reset', String(Math.ceil(reset)));
  if (count > limit) {
    void reply.header('Retry-After', String(Math.ceil(reset)));
    throw new AppError(429, 'rate_limit_exceeded', `More than ${limit} requests a second with this token; retry after ${Math.ceil(reset)} s`);
  }
}

/** onRequest hook of every authenticated scope: token, then rate limit, then permission. */
export function authHook(services: Services, cache: TokenCache) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    request.caller = await authenticate(services, cache, request);
    await rateLimit(services, request.caller, reply);
    const permission = request.routeOptions.config?.permission;
    if (permission && !holds(request.caller.permissions, permission)) {
      throw new PermissionError(
        `This token lacks the "${permission}" permission`,
        request.routeOptions.config.permissionErrorName ?? 'missing_permission',
      );
    }
  };
}

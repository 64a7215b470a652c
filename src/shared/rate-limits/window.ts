import type { Redis } from 'ioredis';
import { AppError } from '../errors.js';
import type { Config } from '../config.js';

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

/** The `RateLimit-*` headers of a limit's decision (draft IETF RateLimit fields). */
export function limitHeaders(decision: Omit<RateDecision, 'allowed'>): Record<string, string> {
  return { 'ratelimit-limit': String(decision.limit), 'ratelimit-remaining': String(decision.remaining), 'ratelimit-reset': String(decision.resetSeconds) };
}

/**
 * The 429 of a limit that refused a request: its own `RateLimit-*` headers (the binding
 * limit's, whatever an earlier limit set) and `Retry-After`, carried by the error.
 */
export function limitExceeded(decision: Omit<RateDecision, 'allowed'>, message: string): AppError {
  return new AppError(429, 'rate_limit_exceeded', message, undefined, { ...limitHeaders(decision), 'retry-after': String(decision.resetSeconds) });
}

/**
 * A fixed one-second window per key in Redis, shared by every process: per token (contract
 * 5) and per organization (docs/security.md); exported for every interface that takes
 * requests (HTTP, SMTP submission).
 *
 * Asking Redis on every request made the rate limit the main cost of an authenticated
 * request (bench/README.md). Instead a process reserves several requests of the window at
 * once (INCRBY n, one round trip shared by the concurrent requests of that token) and
 * spends them locally. n is at most a tenth of what is left of the limit, so a small limit
 * (and the last tenth of any limit) is still counted request by request, exactly. With
 * several processes a token can only be refused slightly early, never late: another
 * process may hold an unspent part of its reservation.
 */
export class WindowRateLimiter {
  private readonly windows = new Map<string, RateWindow>();
  private sweptAt = 0;

  constructor(
    private readonly services: { redis: Redis; config: Pick<Config, 'redisPrefix'> },
    private readonly options: { scope: string; limit: number },
  ) {}

  /** One request of `tokenId` (a token id, an organization id: whatever the scope counts). */
  async take(tokenId: string, nowMs = Date.now()): Promise<RateDecision> {
    const limit = this.options.limit;
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

  /**
   * The refusal `take` would give now, when this process already knows it (the window of this
   * second is full and spent here), without counting anything: undefined otherwise.
   */
  refusing(tokenId: string, nowMs = Date.now()): RateDecision | undefined {
    const second = Math.floor(nowMs / 1000);
    const window = this.windows.get(tokenId);
    if (!window || window.second !== second || !window.full || window.used < window.granted) return undefined;
    return { allowed: false, limit: this.options.limit, remaining: 0, resetSeconds: Math.max(1, Math.ceil(((second + 1) * 1000 - nowMs) / 1000)) };
  }

  private async reserve(tokenId: string, window: RateWindow, limit: number): Promise<void> {
    const wanted = Math.max(1, Math.min(LEASE_MAX, Math.floor((limit - window.total) * LEASE_FRACTION)));
    // Every key of the service starts with REDIS_PREFIX (container.ts redisKey).
    const key = [this.services.config.redisPrefix, this.options.scope, tokenId, String(window.second)].join(':');
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


/**
 * The per-organization limiter: RATE_LIMIT_ORG_PER_SECOND requests of one organization,
 * every token and interface together (API, tools, MCP, v1, SMTP submission), so minting
 * more tokens does not multiply what a tenant may ask of the service.
 */
export function organizationRateLimiter(services: { redis: Redis; config: Pick<Config, 'redisPrefix' | 'rateLimitOrgPerSecond'> }): WindowRateLimiter {
  return new WindowRateLimiter(services, { scope: 'rlo', limit: services.config.rateLimitOrgPerSecond });
}

/** The per-token limiter (docs/foundation.md "Authentication and rate limiting"): RATE_LIMIT_PER_SECOND per token, shared by every API process. */
export function tokenRateLimiter(services: { redis: Redis; config: Pick<Config, 'redisPrefix' | 'rateLimitPerSecond'> }): WindowRateLimiter {
  return new WindowRateLimiter(services, { scope: 'rl', limit: services.config.rateLimitPerSecond });
}

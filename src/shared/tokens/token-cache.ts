import type { Redis } from 'ioredis';
import { LRUCache, type Perf } from 'lru-cache';
import type { Config } from '../config.js';
import type { Logger } from '../logger.js';
import { subscribeTokenChanges } from './revoke.js';
import type { Caller } from './service.js';

// A token is read from PostgreSQL at most once per this long per process, so the hot path
// of an authenticated request costs one in-memory lookup (issue: auth >= 60% of /healthz).
// A revoked token stops working sooner: see TokenCache.
const CACHE_TTL_MS = 30_000;
const NEGATIVE_TTL_MS = 2_000;
const CACHE_MAX = 10_000;

export interface TokenCacheEntry {
  caller: Caller | null;
}

/** lru-cache stores no null: an unknown secret is remembered as this entry. */
const UNKNOWN: TokenCacheEntry = Object.freeze({ caller: null });

/**
 * Secrets already looked up by this process, kept apart by answer: valid tokens (30 s) and
 * unknown secrets (2 s), each a bounded LRU with a TTL (lru-cache). Anyone can send
 * well-formed random `svc_...` secrets; with one cache they evicted the valid entries and
 * every real request went back to the database. Unknown secrets only evict each other.
 *
 * A revocation (refused by every process within 2 s, docs/foundation.md) is announced on the
 * token-change channel with the organization id; every process drops that organization's
 * entries when the message arrives, which takes milliseconds. The cache is only trusted
 * while this process's subscription is up: with the subscriber disconnected an announcement
 * could be missed, so every request then reads PostgreSQL, and the entries are dropped. A
 * lookup that began before an announcement never stores its (possibly revoked) result.
 *
 * One per process, in the services container (`services.tokenCache`), shared by the HTTP
 * API and SMTP submission.
 */
export class TokenCache {
  private readonly valid: LRUCache<string, TokenCacheEntry>;
  private readonly unknown: LRUCache<string, TokenCacheEntry>;
  private generation = 0;
  private subscriber: Redis | undefined;
  private subscribed = false;

  /** `perf`: the clock of the TTLs (lru-cache's option; performance.now by default). */
  constructor(options: { perf?: Perf } = {}) {
    this.valid = new LRUCache({ max: CACHE_MAX, ttl: CACHE_TTL_MS, perf: options.perf });
    this.unknown = new LRUCache({ max: CACHE_MAX, ttl: NEGATIVE_TTL_MS, perf: options.perf });
  }

  /** Subscribes to token-change announcements; the cache stays unused until that succeeds. */
  start(services: { redis: Redis; config: Pick<Config, 'redisPrefix'>; logger: Logger }): void {
    if (this.subscriber) return;
    this.subscriber = subscribeTokenChanges(services, 'token cache', {
      up: () => {
        this.subscribed = true;
      },
      down: () => {
        this.subscribed = false;
        this.clear();
      },
      changed: (organizationId) => this.forgetOrganization(organizationId),
    });
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

  get(secret: string): TokenCacheEntry | undefined {
    if (!this.subscribed) return undefined;
    return this.valid.get(secret) ?? this.unknown.get(secret);
  }

  set(secret: string, caller: Caller | null, generation = this.generation): void {
    if (!this.subscribed || generation !== this.generation) return;
    if (caller) this.valid.set(secret, { caller });
    else this.unknown.set(secret, UNKNOWN);
  }

  /** A token of the organization was minted or revoked. */
  forgetOrganization(organizationId: string): void {
    this.generation += 1;
    const gone = [...this.valid.entries()].filter(([, entry]) => entry.caller?.organizationId === organizationId);
    for (const [secret] of gone) this.valid.delete(secret);
  }

  clear(): void {
    this.generation += 1;
    this.valid.clear();
    this.unknown.clear();
  }
}

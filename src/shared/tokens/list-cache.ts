import type { EntityManager } from '@mikro-orm/postgresql';
import type { Redis } from 'ioredis';
import { LRUCache } from 'lru-cache';
import type { Services } from '../container.js';
import { announceTokenChange, subscribeTokenChanges } from './revoke.js';
import { listTokens } from './service.js';

/** What a token listing shows (docs/foundation.md "Tokens and permissions"): never the secret or its hash. */
export interface TokenSummaryRow {
  id: string;
  name: string;
  last4: string;
  permissions: string[];
  createdAt: Date;
}

// A backstop only: every API process drops an organization's entry as soon as any
// process publishes that its tokens changed.
const TTL_MS = 5_000;
// Larger organizations are listed from PostgreSQL every time.
const MAX_CACHED_TOKENS = 1_000;
const MAX_ORGANIZATIONS = 10_000;

/**
 * An organization's token list, kept in process between writes (an LRU with a TTL, lru-cache).
 *
 * Tokens are added by the create route and deleted by the revoke route or the operator CLI
 * (docs/foundation.md "Authentication and rate limiting"). A change drops the entry of its own
 * process and publishes the organization id on a Redis channel that every API process subscribes
 * to, so another process drops its entry within the time a Redis message takes. The cache is only
 * used while this process's subscription is up: with the subscriber disconnected a message could be
 * missed, so every listing then reads PostgreSQL, and the entries are dropped. A listing that began
 * before a change was announced never stores its (possibly older) result.
 */
export class TokenListCache {
  private readonly entries = new LRUCache<string, TokenSummaryRow[]>({ max: MAX_ORGANIZATIONS, ttl: TTL_MS });
  /** Bumped by every announced change (tokens are created rarely): a listing that began
   * before the last change does not store its result. */
  private generation = 0;
  private subscriber: Redis | undefined;
  private subscribed = false;

  constructor(private readonly services: Pick<Services, 'redis' | 'config' | 'logger'>) {}

  /** Subscribes to change announcements; the cache stays unused until that succeeds. */
  start(): void {
    if (this.subscriber) return;
    this.subscriber = subscribeTokenChanges(this.services, 'token list', {
      up: () => {
        this.subscribed = true;
      },
      // Messages may have been missed while disconnected.
      down: () => {
        this.subscribed = false;
        this.generation += 1;
        this.entries.clear();
      },
      changed: (organizationId) => this.forget(organizationId),
    });
  }

  async close(): Promise<void> {
    this.subscriber?.disconnect();
    this.subscriber = undefined;
    this.subscribed = false;
    this.entries.clear();
  }

  async list(
    em: EntityManager,
    organizationId: string,
    limit: number | undefined,
  ): Promise<{ items: TokenSummaryRow[]; hasMore: boolean }> {
    const cached = this.subscribed ? this.entries.get(organizationId) : undefined;
    let items: TokenSummaryRow[];
    if (cached) {
      items = cached;
    } else {
      const generation = this.generation;
      const rows = (await listTokens(em, organizationId, undefined)).items;
      items = rows.map((t) => ({ id: t.id, name: t.name, last4: t.last4, permissions: t.permissions, createdAt: t.createdAt }));
      if (this.subscribed && this.generation === generation && items.length <= MAX_CACHED_TOKENS) this.entries.set(organizationId, items);
    }
    const hasMore = limit !== undefined && items.length > limit;
    return { items: hasMore ? items.slice(0, limit) : items, hasMore };
  }

  /** After a token of the organization is committed: forget it here and everywhere. */
  async changed(organizationId: string): Promise<void> {
    this.forget(organizationId);
    if (!(await announceTokenChange(this.services.redis, this.services.config, organizationId))) {
      // Other processes then stop trusting their cache only when their subscriber drops.
      this.services.logger.warn('could not announce a token change; other API processes may list it late');
    }
  }

  private forget(organizationId: string): void {
    this.entries.delete(organizationId);
    this.generation += 1;
  }
}

import type { EntityManager } from '@mikro-orm/postgresql';
import type { Redis } from 'ioredis';
import type { Services } from '../container.js';
import { tokenChangesChannel } from './revoke.js';
import { listTokens } from './service.js';

/** What a token listing shows (spec 2.2): never the secret or its hash. */
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

interface Entry {
  items: TokenSummaryRow[];
  expiresAt: number;
}

/**
 * An organization's token list, kept in process between writes.
 *
 * Tokens are added by the create route and deleted by the revoke route or the operator CLI
 * (contract 16). A change drops the entry of its own process and publishes the organization id on
 * a Redis channel that every API process subscribes to, so another process drops its
 * entry within the time a Redis message takes. The cache is only used while this
 * process's subscription is up: with the subscriber disconnected a message could be
 * missed, so every listing then reads PostgreSQL, and the entries are dropped. A listing
 * that began before a change was announced never stores its (possibly older) result.
 */
export class TokenListCache {
  private readonly entries = new Map<string, Entry>();
  /** Bumped by every announced change (tokens are created rarely): a listing that began
   * before the last change does not store its result. */
  private generation = 0;
  private readonly channel: string;
  private subscriber: Redis | undefined;
  private subscribed = false;

  constructor(private readonly services: Services) {
    this.channel = tokenChangesChannel(services.config);
  }

  /** Subscribes to change announcements; the cache stays unused until that succeeds. */
  start(): void {
    const subscriber = this.services.redis.duplicate({ autoResubscribe: false, commandTimeout: undefined });
    subscriber.on('error', (error) => this.services.logger.debug({ err: error }, 'token list subscriber error'));
    subscriber.on('ready', () => {
      subscriber.subscribe(this.channel).then(
        () => {
          this.subscribed = true;
        },
        () => {},
      );
    });
    // Messages may have been missed while disconnected.
    subscriber.on('close', () => {
      this.subscribed = false;
      this.generation += 1;
      this.entries.clear();
    });
    subscriber.on('message', (_channel: string, organizationId: string) => this.forget(organizationId));
    this.subscriber = subscriber;
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
    const now = Date.now();
    const cached = this.subscribed ? this.entries.get(organizationId) : undefined;
    let items: TokenSummaryRow[];
    if (cached && cached.expiresAt > now) {
      items = cached.items;
    } else {
      const generation = this.generation;
      const rows = (await listTokens(em, organizationId, undefined)).items;
      items = rows.map((t) => ({ id: t.id, name: t.name, last4: t.last4, permissions: t.permissions, createdAt: t.createdAt }));
      if (this.subscribed && this.generation === generation && items.length <= MAX_CACHED_TOKENS) this.store(organizationId, items, now);
    }
    const hasMore = limit !== undefined && items.length > limit;
    return { items: hasMore ? items.slice(0, limit) : items, hasMore };
  }

  /** After a token of the organization is committed: forget it here and everywhere. */
  async changed(organizationId: string): Promise<void> {
    this.forget(organizationId);
    await this.services.redis.publish(this.channel, organizationId).catch((error: unknown) => {
      // Other processes then stop trusting their cache only when their subscriber drops.
      this.services.logger.warn({ err: error }, 'could not announce a token change; other API processes may list it late');
    });
  }

  private forget(organizationId: string): void {
    this.entries.delete(organizationId);
    this.generation += 1;
  }

  private store(organizationId: string, items: TokenSummaryRow[], now: number): void {
    if (this.entries.size >= MAX_ORGANIZATIONS) {
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(organizationId, { items, expiresAt: now + TTL_MS });
  }
}

import type { EntityManager } from '@mikro-orm/postgresql';
import type { Redis } from 'ioredis';
import { redisKey } from '../container.js';
import type { Config } from '../config.js';
import type { Logger } from '../logger.js';
import { NotFoundError } from '../errors.js';
import { announce, subscribeAnnouncements } from '../redis.js';
import { deleteToken } from './queries.js';

/**
 * The Redis channel on which a change to an organization's tokens (one minted, one
 * revoked) is announced with the organization id. Every API process listens: the token
 * list cache and the authentication cache drop that organization's entries.
 */
export function tokenChangesChannel(config: Pick<Config, 'redisPrefix'>): string {
  return redisKey(config, 'tokens-changed');
}

/**
 * Listens to token-change announcements on a connection of its own, for a process's token
 * caches (`subscribeAnnouncements` on the token channel).
 */
export function subscribeTokenChanges(
  services: { redis: Redis; config: Pick<Config, 'redisPrefix'>; logger: Logger },
  what: string,
  on: { up(): void; down(): void; changed(organizationId: string): void },
): Redis {
  return subscribeAnnouncements(services, tokenChangesChannel(services.config), what, { up: on.up, down: on.down, message: on.changed });
}

/** Announces that an organization's tokens changed; resolves even when Redis is down. */
export function announceTokenChange(redis: Redis, config: Pick<Config, 'redisPrefix'>, organizationId: string): Promise<boolean> {
  return announce(redis, tokenChangesChannel(config), organizationId);
}

/**
 * Deletes a token (docs/foundation.md "Authentication and rate limiting"). `organizationId` scopes
 * the lookup for API callers: another organization's token is as unknown as a made-up id (404). The
 * operator CLI passes null. The row is deleted, not flagged: nothing refers to a token, and a
 * deleted secret's hash can never match again.
 */
export async function revokeToken(em: EntityManager, organizationId: string | null, tokenId: string): Promise<{ id: string; organizationId: string }> {
  const row = await deleteToken(em, organizationId, tokenId);
  if (!row) throw new NotFoundError(`No token ${tokenId}`);
  return { id: row.id, organizationId: row.organization_id };
}

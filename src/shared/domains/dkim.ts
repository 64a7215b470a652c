import type { EntityManager } from '@mikro-orm/postgresql';
import type { Redis } from 'ioredis';
import { LRUCache } from 'lru-cache';
import type { Config } from '../config.js';
import { redisKey } from '../container.js';
import type { Logger } from '../logger.js';
import { announce, subscribeAnnouncements } from '../redis.js';
import type { SecretBox } from '../crypto.js';
import { Domain } from '../db/entities/index.js';
import { addressDomain, normalizeHostname } from './hostname.js';
import { assertSendingAllowed } from './sending-policy.js';

/**
 * The `dkim` option of a nodemailer transport or message (nodemailer signs with
 * relaxed/relaxed canonicalization and rsa-sha256; those are not options).
 */
export interface DkimSigningOptions {
  domainName: string;
  keySelector: string;
  privateKey: string;
  headerFieldNames: string;
}

/**
 * Headers we sign: the ones a receiver shows or acts on. List-Unsubscribe and
 * List-Unsubscribe-Post must be covered for one-click unsubscribe (RFC 8058 section 4).
 * Headers a relay may add or rewrite (Received, Return-Path) are left out.
 */
export const DKIM_SIGNED_HEADERS = [
  'from',
  'sender',
  'reply-to',
  'to',
  'cc',
  'subject',
  'date',
  'message-id',
  'in-reply-to',
  'references',
  'mime-version',
  'content-type',
  'content-transfer-encoding',
  'list-id',
  'list-unsubscribe',
  'list-unsubscribe-post',
].join(':');

// How long a sending process keeps a domain's key (or its absence) in memory: a send
// costs no query and no decryption. A backstop: a domain added or deleted is announced
// (`announceDomainChange`) and every subscribed process forgets the organization's entries
// at once; only an announcement missed while Redis was unreachable waits for this.
const CACHE_TTL_MS = 60_000;
const CACHE_MAX = 5_000;

interface Entry {
  value: DkimSigningOptions | null;
}

/** The channel on which an organization id is announced when one of its domains is added or deleted. */
export function domainChangesChannel(config: Pick<Config, 'redisPrefix'>): string {
  return redisKey(config, 'domains-changed');
}

/**
 * Announces that an organization's domains changed (after the commit). With Redis down the
 * other processes keep their cached keys until their 60 s run out: said in the log.
 */
export async function announceDomainChange(
  services: { redis: Redis; config: Pick<Config, 'redisPrefix'>; logger: Pick<Logger, 'warn'> },
  organizationId: string,
): Promise<void> {
  if (await announce(services.redis, domainChangesChannel(services.config), organizationId)) return;
  services.logger.warn({ organizationId }, 'domain change not announced (Redis unreachable): sending processes keep their DKIM keys up to 60 s');
}

/**
 * A small in-process LRU of DKIM options by (organization, domain), entries kept CACHE_TTL_MS
 * (lru-cache); once `start`ed, an organization's entries are dropped when a change of its
 * domains is announced, and all of them when the subscription drops (announcements may have
 * been missed meanwhile).
 */
export class DkimKeyCache {
  private readonly entries: LRUCache<string, Entry>;
  private subscriber: Redis | undefined;
  private subscribed: Promise<void> | undefined;
  /**
   * `off`: never started (a cache of its own, its TTL only); `waiting`: started, the
   * subscription not (or no longer) up, so nothing is kept (an announcement could be missed);
   * `live`; `closed`: stopped for good.
   */
  private state: 'off' | 'waiting' | 'live' | 'closed' = 'off';
  /** Bumped by every drop: a lookup that began before one does not store its (older) result. */
  generation = 0;

  constructor(ttlMs = CACHE_TTL_MS) {
    this.entries = new LRUCache({ max: CACHE_MAX, ttl: ttlMs });
  }

  /** Subscribes (once); resolves when the subscription first holds. */
  start(services: { redis: Redis; config: Pick<Config, 'redisPrefix'>; logger: Pick<Logger, 'debug'> }): Promise<void> {
    if (this.state === 'closed') return Promise.resolve();
    if (this.subscribed) return this.subscribed;
    this.state = 'waiting';
    this.clear();
    this.subscribed = new Promise((resolve) => {
      this.subscriber = subscribeAnnouncements(services, domainChangesChannel(services.config), 'DKIM key cache', {
        up: () => {
          if (this.state === 'closed') return;
          this.clear();
          this.state = 'live';
          resolve();
        },
        down: () => {
          if (this.state === 'closed') return;
          this.state = 'waiting';
          this.clear();
        },
        message: (organizationId) => this.forget(organizationId),
      });
    });
    return this.subscribed;
  }

  /** Stops the subscription for good: a later `start` does nothing. */
  close(): void {
    this.state = 'closed';
    this.subscriber?.disconnect();
    this.subscriber = undefined;
    this.clear();
  }

  get(key: string): Entry | undefined {
    return this.state === 'waiting' ? undefined : this.entries.get(key);
  }

  /** Stores a lookup's result, unless an entry was dropped since `generation` was read. */
  set(key: string, value: DkimSigningOptions | null, generation = this.generation): void {
    if (generation === this.generation && this.state !== 'waiting') this.entries.set(key, { value });
  }

  /** Drops the organization's entries (keys start with its id). */
  forget(organizationId: string): void {
    this.generation += 1;
    const prefix = `${organizationId}:`;
    for (const key of [...this.entries.keys()]) if (key.startsWith(prefix)) this.entries.delete(key);
  }

  clear(): void {
    this.generation += 1;
    this.entries.clear();
  }
}

/**
 * nodemailer's `dkim` option for mail from `fromDomain` (a hostname or a whole address) of
 * the organization, or null when the organization has no such domain. Signs whatever the
 * domain's status (docs/domains.md "DKIM signing"); whether sending
 * from it is allowed at all is `assertSendingDomainAllowed`.
 */
export async function dkimOptionsFor(
  /** Or a function giving one: a send answered from the cache then makes no fork. */
  em: EntityManager | (() => EntityManager),
  box: SecretBox,
  organizationId: string,
  fromDomain: string,
  /** The process's (services.dkimKeys). */
  cache: DkimKeyCache,
): Promise<DkimSigningOptions | null> {
  // Looked up as given first (every send asks): normalizing a hostname costs more than the lookup.
  const givenKey = `${organizationId}:${fromDomain}`;
  const given = cache.get(givenKey);
  if (given) return given.value;
  const hostname = fromDomain.includes('@') ? addressDomain(fromDomain) : normalizeHostname(fromDomain);
  if (!hostname) return null;
  const key = `${organizationId}:${hostname}`;
  const cached = cache.get(key);
  if (cached) {
    cache.set(givenKey, cached.value);
    return cached.value;
  }
  const generation = cache.generation;
  const domain = await (typeof em === 'function' ? em() : em).findOne(Domain, { organizationId, domain: hostname }, { fields: ['domain', 'dkimSelector', 'dkimPrivateKeySealed'] });
  const value = domain
    ? {
        domainName: domain.domain,
        keySelector: domain.dkimSelector,
        privateKey: box.open(domain.dkimPrivateKeySealed),
        headerFieldNames: DKIM_SIGNED_HEADERS,
      }
    : null;
  cache.set(key, value, generation);
  if (givenKey !== key) cache.set(givenKey, value, generation);
  return value;
}

/** The sending policy's check as the API answers it (kept under its first name; see sending-policy.ts). */
export const assertSendingDomainAllowed = (
  em: EntityManager,
  config: Pick<Config, 'allowUnverifiedDomains'>,
  organizationId: string,
  from: string,
  path = 'from',
): Promise<void> => assertSendingAllowed(em, config, organizationId, from, path);

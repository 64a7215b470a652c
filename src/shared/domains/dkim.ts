import type { EntityManager } from '@mikro-orm/postgresql';
import { LRUCache } from 'lru-cache';
import type { Config } from '../config.js';
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
// costs no query and no decryption, and a new or deleted domain is seen within a minute.
const CACHE_TTL_MS = 60_000;
const CACHE_MAX = 5_000;

interface Entry {
  value: DkimSigningOptions | null;
}

/** A small in-process LRU of DKIM options by (organization, domain), entries kept CACHE_TTL_MS (lru-cache). */
export class DkimKeyCache {
  private readonly entries: LRUCache<string, Entry>;

  constructor(ttlMs = CACHE_TTL_MS) {
    this.entries = new LRUCache({ max: CACHE_MAX, ttl: ttlMs });
  }

  get(key: string): Entry | undefined {
    return this.entries.get(key);
  }

  set(key: string, value: DkimSigningOptions | null): void {
    this.entries.set(key, { value });
  }

  clear(): void {
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
  const domain = await (typeof em === 'function' ? em() : em).findOne(Domain, { organizationId, domain: hostname }, { fields: ['domain', 'dkimSelector', 'dkimPrivateKeySealed'] });
  const value = domain
    ? {
        domainName: domain.domain,
        keySelector: domain.dkimSelector,
        privateKey: box.open(domain.dkimPrivateKeySealed),
        headerFieldNames: DKIM_SIGNED_HEADERS,
      }
    : null;
  cache.set(key, value);
  if (givenKey !== key) cache.set(givenKey, value);
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

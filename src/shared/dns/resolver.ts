import { lookup as systemLookup, Resolver } from 'node:dns/promises';
import { isIP } from 'node:net';
import type { Redis } from 'ioredis';
import { LRUCache } from 'lru-cache';
import type { Config } from '../config.js';
import { redisKey } from '../container.js';
import type { Logger } from '../logger.js';
import type { Metrics } from '../metrics.js';
import { StartupError } from '../startup.js';
import type { DnsLookup, DnsResult, MxRecord } from './types.js';

/**
 * How long answers stay in the Redis cache (seconds). node:dns gives the TTL of A/AAAA
 * answers but not of MX/TXT ones, so those get `defaultTtl`; every positive TTL is then
 * clamped to [floor, ceiling]. NXDOMAIN/NODATA are kept `negativeTtl` (we do not see the
 * SOA minimum either). Temporary failures are never cached.
 */
export interface DnsCachePolicy {
  floor: number;
  ceiling: number;
  defaultTtl: number;
  negativeTtl: number;
}

export const DEFAULT_CACHE_POLICY: DnsCachePolicy = {
  // Below 30 s a busy verifier would ask the same question many times a second for nothing.
  floor: 30,
  // Above 6 h a changed MX would take too long to be seen (verification's routing cache of
  // 12 h is a separate, higher-level cache).
  ceiling: 6 * 3600,
  defaultTtl: 300,
  negativeTtl: 60,
};

// The per-process layer in front of Redis: a hot name costs no round trip. An entry lives
// at most this long here (and never past its TTL), so an answer refreshed by another
// process (e.g. a verification's fresh lookup) is seen within a minute.
const LOCAL_TTL_MS = 60_000;
const LOCAL_MAX = 20_000;

export interface DnsOptions {
  /** `host` or `host:port` (DNS_SERVERS); the system resolver's servers when absent. */
  servers?: string[];
  /** Per query attempt. */
  timeoutMs?: number;
  tries?: number;
  cache?: Partial<DnsCachePolicy>;
  logger?: Logger;
  /** Where cache hits and misses are counted (docs/operations.md). */
  metrics?: Pick<Metrics, 'dnsCacheHits' | 'dnsCacheMisses'>;
}

/**
 * The service's DNS: `DnsLookup` answered from a Redis cache first, `fresh` straight from
 * the servers (used by sending-domain verification, which must see a record the moment the
 * user publishes it). A fresh answer also refreshes the cache.
 */
export interface DnsService extends DnsLookup {
  readonly fresh: DnsLookup;
}

type RecordType = 'a' | 'aaaa' | 'mx' | 'txt';
type RecordOf<T extends RecordType> = T extends 'mx' ? MxRecord : string;

interface CachedEntry {
  k: 'answer' | 'nxdomain' | 'nodata';
  r?: unknown[];
  /** Expiry, epoch milliseconds. */
  e: number;
}

type Uncached<T> = { kind: 'answer'; records: T[]; ttl: number } | { kind: 'nxdomain' } | { kind: 'nodata' } | { kind: 'temporary'; reason: string };

const NEGATIVE_CODES: Record<string, 'nxdomain' | 'nodata'> = {
  ENOTFOUND: 'nxdomain',
  // An unparsable name cannot exist: as good as NXDOMAIN.
  EBADNAME: 'nxdomain',
  ENODATA: 'nodata',
};

export class CachedDns implements DnsService {
  readonly fresh: DnsLookup;
  private readonly policy: DnsCachePolicy;
  private readonly logger?: Logger;
  private readonly metrics?: Pick<Metrics, 'dnsCacheHits' | 'dnsCacheMisses'>;
  private readonly local = new LRUCache<string, CachedEntry>({ max: LOCAL_MAX, ttl: LOCAL_TTL_MS });
  /** Identical concurrent misses share one query. */
  private readonly inFlight = new Map<string, Promise<DnsResult<unknown>>>();

  constructor(
    private readonly resolver: Resolver,
    private readonly redis: Redis,
    private readonly keyPrefix: string,
    options: Pick<DnsOptions, 'cache' | 'logger' | 'metrics'> = {},
  ) {
    this.policy = { ...DEFAULT_CACHE_POLICY, ...options.cache };
    this.logger = options.logger;
    this.metrics = options.metrics;
    this.fresh = {
      a: (name) => this.query('a', name, false),
      aaaa: (name) => this.query('aaaa', name, false),
      mx: (name) => this.query('mx', name, false),
      txt: (name) => this.query('txt', name, false),
    };
  }

  a(name: string) {
    return this.query('a', name, true);
  }
  aaaa(name: string) {
    return this.query('aaaa', name, true);
  }
  mx(name: string) {
    return this.query('mx', name, true);
  }
  txt(name: string) {
    return this.query('txt', name, true);
  }

  private key(type: RecordType, name: string): string {
    return `${this.keyPrefix}:${type}:${name}`;
  }

  private async query<T extends RecordType>(type: T, rawName: string, useCache: boolean): Promise<DnsResult<RecordOf<T>>> {
    const name = normalize(rawName);
    if (useCache) {
      const cached = await this.readCache<RecordOf<T>>(type, name);
      if (cached) {
        this.metrics?.dnsCacheHits.inc({ type });
        return cached;
      }
    }
    const flightKey = `${useCache ? 'c' : 'f'}:${type}:${name}`;
    let pending = this.inFlight.get(flightKey) as Promise<DnsResult<RecordOf<T>>> | undefined;
    if (!pending) {
      // A lookup that joins an identical one in flight asks no server: not counted.
      this.metrics?.dnsCacheMisses.inc({ type });
      pending = this.resolveAndStore(type, name).finally(() => this.inFlight.delete(flightKey));
      this.inFlight.set(flightKey, pending);
    }
    return pending;
  }

  private remember(key: string, entry: CachedEntry, now: number): void {
    // Kept a minute at most, and never past the answer's own expiry (lru-cache reads a TTL
    // of 0 as "forever": an answer already expired is not kept).
    const ttl = Math.min(entry.e - now, LOCAL_TTL_MS);
    if (ttl > 0) this.local.set(key, entry, { ttl });
  }

  private async readCache<R>(type: RecordType, name: string): Promise<DnsResult<R> | null> {
    const key = this.key(type, name);
    const now = Date.now();
    let entry: CachedEntry | undefined;
    const local = this.local.get(key);
    if (local) {
      entry = local;
    } else {
      let raw: string | null;
      try {
        raw = await this.redis.get(key);
      } catch (error) {
        // The cache is an optimisation: without Redis we still answer, just slower.
        this.logger?.debug({ err: error }, 'dns cache read failed');
        return null;
      }
      if (!raw) return null;
      try {
        entry = JSON.parse(raw) as CachedEntry;
      } catch {
        return null; // not ours or truncated: treat as a miss, the next answer overwrites it
      }
      if (entry.e > now) this.remember(key, entry, now);
    }
    const remaining = Math.ceil((entry.e - now) / 1000);
    if (remaining <= 0) return null;
    // A copy: a caller sorting or editing its answer must not change the cached one.
    if (entry.k === 'answer') return { kind: 'answer', records: [...(entry.r ?? [])] as R[], ttl: remaining, cacheHit: true };
    return { kind: entry.k, cacheHit: true };
  }

  private async resolveAndStore<T extends RecordType>(type: T, name: string): Promise<DnsResult<RecordOf<T>>> {
    const result = (await this.resolve(type, name)) as Uncached<RecordOf<T>>;
    if (result.kind === 'temporary') return result;
    const ttl = result.kind === 'answer' ? this.clamp(result.ttl) : this.policy.negativeTtl;
    const entry: CachedEntry = { k: result.kind, e: Date.now() + ttl * 1000 };
    if (result.kind === 'answer') entry.r = [...result.records];
    const key = this.key(type, name);
    this.remember(key, entry, Date.now());
    try {
      await this.redis.set(key, JSON.stringify(entry), 'PX', ttl * 1000);
    } catch (error) {
      this.logger?.debug({ err: error }, 'dns cache write failed');
    }
    return result.kind === 'answer' ? { kind: 'answer', records: result.records, ttl, cacheHit: false } : { kind: result.kind, cacheHit: false };
  }

  private clamp(ttl: number): number {
    return Math.min(this.policy.ceiling, Math.max(this.policy.floor, Math.floor(ttl)));
  }

  private async resolve(type: RecordType, name: string): Promise<Uncached<unknown>> {
    try {
      switch (type) {
        case 'a':
        case 'aaaa': {
          const answers = type === 'a' ? await this.resolver.resolve4(name, { ttl: true }) : await this.resolver.resolve6(name, { ttl: true });
          if (answers.length === 0) return { kind: 'nodata' };
          return { kind: 'answer', records: answers.map((r) => r.address), ttl: Math.min(...answers.map((r) => r.ttl)) };
        }
        case 'mx': {
          const answers = await this.resolver.resolveMx(name);
          if (answers.length === 0) return { kind: 'nodata' };
          // A null MX (RFC 7505, `0 .`) comes back as exchange "".
          const records: MxRecord[] = answers
            .map((r) => ({ exchange: r.exchange.replace(/\.$/, '').toLowerCase(), priority: r.priority }))
            .sort((x, y) => x.priority - y.priority || x.exchange.localeCompare(y.exchange));
          return { kind: 'answer', records, ttl: this.policy.defaultTtl };
        }
        case 'txt': {
          const answers = await this.resolver.resolveTxt(name);
          if (answers.length === 0) return { kind: 'nodata' };
          return { kind: 'answer', records: answers.map((chunks) => chunks.join('')), ttl: this.policy.defaultTtl };
        }
      }
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code ?? 'EUNKNOWN';
      const negative = NEGATIVE_CODES[code];
      if (negative) return { kind: negative };
      // ESERVFAIL, ETIMEOUT, ECONNREFUSED, EREFUSED, ...: "we could not find out right now".
      return { kind: 'temporary', reason: code };
    }
  }
}

function normalize(name: string): string {
  return name.trim().toLowerCase().replace(/\.$/, '');
}

/**
 * `host` or `host:port` as node:dns wants it: an IP, optionally with a port (IPv6 in
 * brackets). A host name is resolved once here through the system resolver.
 */
export async function toResolverServer(server: string): Promise<string> {
  const bracketed = /^\[([0-9a-fA-F:]+)\](?::(\d+))?$/.exec(server);
  let host: string;
  let port: string | undefined;
  if (bracketed) {
    [, host, port] = bracketed as unknown as [string, string, string | undefined];
  } else if (isIP(server) === 6) {
    host = server;
  } else {
    const i = server.lastIndexOf(':');
    [host, port] = i === -1 ? [server, undefined] : [server.slice(0, i), server.slice(i + 1)];
  }
  if (isIP(host) === 0) host = (await systemLookup(host)).address;
  const ip = isIP(host) === 6 ? `[${host}]` : host;
  return port ? `${ip}:${port}` : host;
}

/** The DNS of the service (Services.dns). */
export async function createDns(
  redis: Redis,
  config: Pick<Config, 'redisPrefix' | 'dnsServers'>,
  options: DnsOptions = {},
): Promise<CachedDns> {
  // 2 s × 2 tries: long enough for a slow authoritative server, short enough that a
  // verification request (answered in the API request) never hangs.
  const resolver = new Resolver({ timeout: options.timeoutMs ?? 2_000, tries: options.tries ?? 2 });
  const servers = options.servers ?? config.dnsServers;
  if (servers && servers.length > 0) {
    const resolved = await Promise.all(servers.map(toResolverServer)).catch((error: NodeJS.ErrnoException) => {
      throw new StartupError(`DNS_SERVERS: a server's host name does not resolve (${error.code ?? error.message}); give IP addresses`);
    });
    resolver.setServers(resolved);
  }
  return new CachedDns(resolver, redis, redisKey(config, 'dns'), { cache: options.cache, logger: options.logger, metrics: options.metrics });
}

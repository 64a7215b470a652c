import type { Redis } from 'ioredis';
import { LRUCache } from 'lru-cache';
import type { DnsLookup } from '../dns/types.js';
import { isPinnedProvider } from './lists.js';

/**
 * DNS mail routing of a domain (rule 1 of docs/verification.md) and its cache (rule 9).
 * - MX records → the lowest-preference exchanges that resolve to an address (A, then AAAA);
 * - no MX at all (NODATA) → the domain's own A/AAAA: the implicit MX of RFC 5321 5.1;
 * - a null MX (one record, preference 0, exchange ".", RFC 7505) → no mail destination;
 * - NXDOMAIN → the domain does not exist; no MX, A or AAAA → no mail destination;
 * - MX records none of whose exchanges (the first MAX_EXCHANGES) has an address → no mail destination either;
 * - a temporary failure anywhere → `temporary`, never cached.
 * Definitive answers are cached in Redis per domain, shared by every organization: routes
 * 12 hours (7 days for PINNED_PROVIDERS), answers without a route 1 hour, so a domain that
 * is being set up is not refused for half a day.
 */
export type Routing =
  | { outcome: 'mx' | 'implicit'; hosts: string[]; addresses: string[] }
  | { outcome: 'null_mx' | 'nxdomain' }
  // `unresolvedMx`: MX records exist, but none of their exchanges has an address (the message
  // says so). An extra field, not an outcome of its own: the value is cached in Redis, and a
  // process of the previous release reading it must still see `no_route`.
  | { outcome: 'no_route'; unresolvedMx?: true };

export type RoutingLookup = (Routing & { cacheHit: boolean }) | { outcome: 'temporary'; reason: string; cacheHit: false };

export const ROUTE_TTL_SECONDS = 12 * 3600;
export const PINNED_ROUTE_TTL_SECONDS = 7 * 24 * 3600;
export const NEGATIVE_TTL_SECONDS = 3600;
/**
 * Exchanges tried in preference order before giving up on a domain: as far as a sending MTA
 * goes (RFC 5321 5.1 tries them all; a domain rarely publishes more), bounded so that one
 * verification costs at most 2 lookups an exchange.
 */
const MAX_EXCHANGES = 10;

class Temporary extends Error {}

async function addressesOf(dns: DnsLookup, host: string): Promise<string[]> {
  const a = await dns.a(host);
  if (a.kind === 'temporary') throw new Temporary(`A ${host}: ${a.reason}`);
  if (a.kind === 'answer' && a.records.length > 0) return a.records;
  const aaaa = await dns.aaaa(host);
  if (aaaa.kind === 'temporary') throw new Temporary(`AAAA ${host}: ${aaaa.reason}`);
  return aaaa.kind === 'answer' ? aaaa.records : [];
}

export async function resolveRouting(dns: DnsLookup, domain: string): Promise<Routing | { outcome: 'temporary'; reason: string }> {
  try {
    const mx = await dns.mx(domain);
    if (mx.kind === 'temporary') return { outcome: 'temporary', reason: `MX ${domain}: ${mx.reason}` };
    if (mx.kind === 'nxdomain') return { outcome: 'nxdomain' };
    if (mx.kind === 'answer' && mx.records.length > 0) {
      if (mx.records.some((r) => r.exchange === '' || r.exchange === '.')) return { outcome: 'null_mx' };
      const exchanges = [...mx.records].sort((x, y) => x.priority - y.priority).map((r) => r.exchange.replace(/\.$/, '').toLowerCase());
      // The preferred exchange first (it almost always answers: one lookup); the others
      // together (one request never waits for nine slow name servers in a row), taken in
      // preference order: the first exchange with an address is the route.
      const lookup = (host: string) =>
        addressesOf(dns, host).then(
          (addresses) => ({ addresses }),
          (error: unknown) => {
            if (!(error instanceof Temporary)) throw error;
            return { temporary: error };
          },
        );
      const first = await lookup(exchanges[0]!);
      const looked = 'addresses' in first && first.addresses.length > 0 ? [first] : [first, ...(await Promise.all(exchanges.slice(1, MAX_EXCHANGES).map(lookup)))];
      for (const found of looked) if ('addresses' in found && found.addresses.length > 0) return { outcome: 'mx', hosts: exchanges, addresses: found.addresses };
      const temporary = looked.find((found) => 'temporary' in found);
      return temporary && 'temporary' in temporary ? { outcome: 'temporary', reason: temporary.temporary.message } : { outcome: 'no_route', unresolvedMx: true };
    }
    const addresses = await addressesOf(dns, domain);
    return addresses.length > 0 ? { outcome: 'implicit', hosts: [domain], addresses } : { outcome: 'no_route' };
  } catch (error) {
    if (error instanceof Temporary) return { outcome: 'temporary', reason: error.message };
    throw error;
  }
}

export function routingTtl(domain: string, routing: Routing): number {
  if (routing.outcome !== 'mx' && routing.outcome !== 'implicit') return NEGATIVE_TTL_SECONDS;
  return isPinnedProvider(domain) ? PINNED_ROUTE_TTL_SECONDS : ROUTE_TTL_SECONDS;
}

/**
 * A small in-process copy of the Redis cache in front of it: the busiest domains (the big
 * providers) then cost no round trip at all. Entries live at most a minute, so a change
 * in Redis (expiry) is seen by every process soon after. An LRU with per-entry TTLs (lru-cache).
 */
export class LocalRoutingCache {
  private readonly entries: LRUCache<string, Routing>;

  constructor(
    private readonly ttlMs = 60_000,
    max = 10_000,
  ) {
    this.entries = new LRUCache({ max, ttl: ttlMs });
  }

  get(domain: string): Routing | undefined {
    return this.entries.get(domain);
  }

  /** Kept at most a minute, and no longer than Redis keeps it. */
  set(domain: string, routing: Routing, ttlSeconds: number): void {
    this.entries.set(domain, routing, { ttl: Math.min(this.ttlMs, ttlSeconds * 1000) });
  }
}

export interface RoutingDeps {
  dns: DnsLookup;
  redis: Redis;
  cacheKey: (domain: string) => string;
  local?: LocalRoutingCache;
}

/** Routing of `domain`, from the shared cache when there, else resolved and cached. */
export async function lookupRouting(deps: RoutingDeps, domain: string): Promise<RoutingLookup> {
  const local = deps.local?.get(domain);
  if (local) return { ...local, cacheHit: true };
  const key = deps.cacheKey(domain);
  const replies = await deps.redis.multi().get(key).ttl(key).exec();
  const cached = (replies?.[0]?.[1] ?? null) as string | null;
  const ttl = Number(replies?.[1]?.[1] ?? -1);
  if (cached) {
    const routing = JSON.parse(cached) as Routing;
    if (ttl > 0) deps.local?.set(domain, routing, ttl);
    return { ...routing, cacheHit: true };
  }
  const routing = await resolveRouting(deps.dns, domain);
  if (routing.outcome === 'temporary') return { ...routing, cacheHit: false };
  const seconds = routingTtl(domain, routing);
  await deps.redis.set(key, JSON.stringify(routing), 'EX', seconds);
  deps.local?.set(domain, routing, seconds);
  return { ...routing, cacheHit: false };
}

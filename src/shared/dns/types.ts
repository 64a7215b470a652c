/**
 * What every name lookup of the service answers (sending domains, address verification).
 * A temporary failure (SERVFAIL, timeout, refused) is its own kind so callers can tell
 * "this domain has no mail route" from "we could not find out right now"; it is never cached.
 */
export type DnsResult<T> =
  | { kind: 'answer'; records: T[]; ttl: number; cacheHit: boolean }
  | { kind: 'nxdomain'; cacheHit: boolean }
  | { kind: 'nodata'; cacheHit: boolean }
  | { kind: 'temporary'; reason: string };

export interface MxRecord {
  exchange: string;
  priority: number;
}

export interface DnsLookup {
  mx(name: string): Promise<DnsResult<MxRecord>>;
  a(name: string): Promise<DnsResult<string>>;
  aaaa(name: string): Promise<DnsResult<string>>;
  /** Each TXT record with its character-strings joined. */
  txt(name: string): Promise<DnsResult<string>>;
}

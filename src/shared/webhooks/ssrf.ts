import type { LookupAddress, LookupOptions } from 'node:dns';
import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';
import type { DnsLookup } from '../dns/types.js';

/**
 * The SSRF guard of webhook URLs (docs/webhooks.md "Input rules"). A customer's URL must not make
 * the service call itself or its neighbours: loopback, private (RFC 1918), link-local (which holds
 * the clouds' metadata address 169.254.169.254), unique-local, carrier-grade NAT, multicast,
 * unspecified and reserved addresses are refused. ipaddr.js classifies addresses by the IANA
 * special-purpose registries; only what it calls plain `unicast` is public.
 *
 * The check runs at create/update (422) and again when connecting: the connection is made to
 * the very address that was checked (a `lookup` hook of the socket), so a DNS answer that
 * changes between the check and the request (DNS rebinding) cannot slip through.
 */
export function isPublicAddress(address: string): boolean {
  if (!ipaddr.isValid(address)) return false;
  let parsed = ipaddr.parse(address);
  if (parsed.kind() === 'ipv6') {
    const v6 = parsed as ipaddr.IPv6;
    // ::/96, the deprecated IPv4-compatible addresses (RFC 4291 2.5.5.1; `::7f00:1` is
    // 127.0.0.1's): ipaddr.js calls them unicast, no public host has one.
    if (v6.parts.slice(0, 6).every((part) => part === 0)) return false;
    if (v6.isIPv4MappedAddress()) parsed = v6.toIPv4Address();
  }
  return parsed.range() === 'unicast';
}

export class UnsafeAddressError extends Error {
  readonly code = 'EWEBHOOKADDRESS';
  constructor(message: string) {
    super(message);
    this.name = 'UnsafeAddressError';
  }
}

/** A URL's host as a bare name or address (IPv6 without its brackets). */
export function hostOf(url: URL): string {
  return url.hostname.replace(/^\[(.*)\]$/, '$1');
}

/**
 * The addresses a host resolves to, through the service's DNS (DNS_SERVERS). `localhost`
 * is loopback by definition (RFC 6761) and never asked.
 */
export async function resolveHost(host: string, dns: DnsLookup): Promise<string[]> {
  if (isIP(host)) return [host];
  const name = host.toLowerCase().replace(/\.$/, '');
  if (name === 'localhost' || name.endsWith('.localhost')) return ['127.0.0.1', '::1'];
  const [a, aaaa] = await Promise.all([dns.a(name), dns.aaaa(name)]);
  const addresses = [...(a.kind === 'answer' ? a.records : []), ...(aaaa.kind === 'answer' ? aaaa.records : [])];
  if (addresses.length > 0) return addresses;
  if (a.kind === 'temporary' || aaaa.kind === 'temporary') throw new UnsafeAddressError(`could not resolve ${name} right now`);
  throw new UnsafeAddressError(`${name} does not resolve to an address`);
}

/** Why a host may not be called, or undefined when it may. */
export async function refusedHost(host: string, dns: DnsLookup): Promise<string | undefined> {
  let addresses: string[];
  try {
    addresses = await resolveHost(host, dns);
  } catch (error) {
    return (error as Error).message;
  }
  const refused = addresses.find((a) => !isPublicAddress(a));
  return refused === undefined ? undefined : `${host} resolves to ${refused}, a loopback, private, link-local or reserved address`;
}

type LookupCallback = (error: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/**
 * A `lookup` for sockets (net/tls `connect` options) that resolves through the service's DNS
 * and, unless private addresses are allowed, fails the connection when any address of the
 * host is not public.
 */
export function guardedLookup(dns: DnsLookup, allowPrivate: boolean) {
  return (hostname: string, options: LookupOptions, callback: LookupCallback): void => {
    resolveHost(hostname, dns).then(
      (addresses) => {
        const refused = allowPrivate ? undefined : addresses.find((a) => !isPublicAddress(a));
        if (refused !== undefined) {
          callback(new UnsafeAddressError(`${hostname} resolves to ${refused}, which webhooks may not call`), '');
          return;
        }
        let list = addresses.map((address) => ({ address, family: isIP(address) }));
        if (options.family === 4 || options.family === 6) list = list.filter((a) => a.family === options.family);
        if (list.length === 0) {
          callback(Object.assign(new Error(`${hostname} has no address of the family asked`), { code: 'ENOTFOUND' }), '');
          return;
        }
        if (options.all) callback(null, list);
        else callback(null, list[0]!.address, list[0]!.family);
      },
      (error: Error) => callback(Object.assign(error, { code: (error as NodeJS.ErrnoException).code ?? 'ENOTFOUND' }), ''),
    );
  };
}

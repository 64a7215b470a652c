import type { DomainDnsRecord, DomainStatus } from '../db/entities/index.js';

/** TTL we suggest for every record: an hour, so a correction spreads quickly. */
export const RECORD_TTL = 3600;
/** Subdomain used as the envelope sender (Return-Path) and for SPF. */
export const RETURN_PATH_LABEL = 'bounces';

export interface RecordInput {
  domain: string;
  selector: string;
  /** Base64 of the DER SubjectPublicKeyInfo. */
  publicKey: string;
  /** Host that sends and receives bounces for the service (hostname of PUBLIC_URL). */
  mailHost: string;
}

export function returnPathDomain(domain: string): string {
  return `${RETURN_PATH_LABEL}.${domain}`;
}

/**
 * The records a user publishes. SPF and the MX live on the return-path subdomain, so they
 * never collide with the SPF record the apex may already carry (one SPF record per name).
 */
export function buildDnsRecords(input: RecordInput, status: DomainStatus = 'NOT_STARTED'): DomainDnsRecord[] {
  const returnPath = returnPathDomain(input.domain);
  return [
    {
      type: 'TXT',
      name: `${input.selector}._domainkey.${input.domain}`,
      value: `v=DKIM1; k=rsa; p=${input.publicKey}`,
      priority: null,
      ttl: RECORD_TTL,
      purpose: 'dkim',
      status,
    },
    {
      type: 'TXT',
      name: returnPath,
      value: `v=spf1 a:${input.mailHost} ~all`,
      priority: null,
      ttl: RECORD_TTL,
      purpose: 'spf',
      status,
    },
    {
      type: 'TXT',
      name: `_dmarc.${input.domain}`,
      value: `v=DMARC1; p=none; rua=mailto:dmarc@${input.domain}`,
      priority: null,
      ttl: RECORD_TTL,
      purpose: 'dmarc',
      status,
    },
    { type: 'MX', name: returnPath, value: input.mailHost, priority: 10, ttl: RECORD_TTL, purpose: 'return_path', status },
  ];
}

/** `k=v; k2=v2` tag list (RFC 6376 3.2) with whitespace removed from values. */
export function parseTags(record: string): Map<string, string> {
  const tags = new Map<string, string>();
  for (const part of record.split(';')) {
    const eq = part.indexOf('=');
    if (eq === -1) continue;
    tags.set(part.slice(0, eq).trim().toLowerCase(), part.slice(eq + 1).replace(/\s+/g, ''));
  }
  return tags;
}

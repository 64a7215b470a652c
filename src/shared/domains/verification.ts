import { LockMode, type EntityManager } from '@mikro-orm/postgresql';
import { Domain, type DomainDnsRecord, type DomainStatus } from '../db/entities/index.js';
import type { DnsLookup } from '../dns/types.js';
import { parseTags } from './records.js';
import { recordDomainStatus } from '../webhooks/queries.js';

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

/** A domain still PENDING this long after verification was requested becomes FAILED. */
export const PENDING_LIMIT_MS = 72 * HOUR;
/** A VERIFIED domain is re-checked this often (a record removed sends it back to PENDING). */
export const VERIFIED_RECHECK_MS = 24 * HOUR;

/**
 * Decided here (the API leaves it open; docs/domains.md "Verification"): every allowed change of a
 * domain's status, and what causes it. `canTransition` is the one check.
 */
export const DOMAIN_TRANSITIONS: Readonly<Record<DomainStatus, readonly DomainStatus[]>> = {
  NOT_STARTED: ['PENDING'], // POST /verify
  PENDING: ['VERIFIED', 'FAILED'], // DKIM and SPF found / 72 hours without them
  VERIFIED: ['PENDING'], // a required record disappeared
  FAILED: ['PENDING'], // POST /verify again
};

export function canTransition(from: DomainStatus, to: DomainStatus): boolean {
  return from === to || DOMAIN_TRANSITIONS[from].includes(to);
}

/** Records whose absence keeps a domain from VERIFIED; DMARC and the MX are reported only. */
const REQUIRED: ReadonlySet<DomainDnsRecord['purpose']> = new Set(['dkim', 'spf']);

const LABELS: Record<DomainDnsRecord['purpose'], string> = {
  dkim: 'DKIM',
  spf: 'SPF',
  dmarc: 'DMARC',
  return_path: 'return-path',
};

/**
 * When a PENDING domain is next checked: every minute for the first hour, then backing off
 * (10 min until 6 h, 30 min until 24 h, hourly after), never past the 72-hour deadline.
 */
export function nextPendingCheck(pendingSince: Date, now: Date): Date {
  const age = now.getTime() - pendingSince.getTime();
  const interval = age < HOUR ? MINUTE : age < 6 * HOUR ? 10 * MINUTE : age < 24 * HOUR ? 30 * MINUTE : HOUR;
  const deadline = pendingSince.getTime() + PENDING_LIMIT_MS;
  // Never past the deadline, nor before now (that check fails it).
  return new Date(Math.max(now.getTime(), Math.min(now.getTime() + interval, deadline)));
}

export type RecordFinding = 'found' | 'missing' | 'mismatch' | 'temporary';

export interface RecordCheck {
  record: DomainDnsRecord;
  finding: RecordFinding;
  detail: string;
}

function normalizeTxt(value: string): string {
  return value.trim().replace(/\s+/g, ' ').toLowerCase();
}

/** Whether one published TXT/MX answer satisfies the record we asked for. */
function satisfies(record: DomainDnsRecord, published: string[]): boolean {
  switch (record.purpose) {
    case 'dkim': {
      const wanted = parseTags(record.value).get('p');
      return published.some((txt) => {
        const tags = parseTags(txt);
        const version = tags.get('v');
        // A key receivers can use for our signatures (RFC 6376 3.6.1): an RSA key (`k=` absent
        // or rsa), whose hash algorithms (`h=`, absent for all) include sha256.
        const keyType = (tags.get('k') ?? 'rsa').trim().toLowerCase();
        const hashes = tags.get('h')?.split(':').map((h) => h.trim().toLowerCase());
        return (version === undefined || version === 'DKIM1') && keyType === 'rsa' && (hashes === undefined || hashes.includes('sha256')) && tags.get('p') === wanted;
      });
    }
    case 'spf': {
      // Published "as given": the v=spf1 record holds every mechanism we asked for (the user
      // may add their own, and may choose another `all` qualifier).
      // As receivers evaluate it (RFC 7208): one v=spf1 record at the name (two are a
      // permerror), and our mechanisms before its `all` (nothing after `all` is evaluated).
      // `+` is the default qualifier (RFC 7208 4.6.2): `+a:host` is `a:host`.
      const terms = (txt: string) => normalizeTxt(txt).split(' ').map((t) => t.replace(/^\+(?!all$)/, ''));
      const wanted = terms(record.value).filter((t) => t !== 'v=spf1' && !/^[~?+-]?all$/.test(t));
      const spf = published.map(terms).filter((list) => list[0] === 'v=spf1');
      if (spf.length !== 1) return false;
      const found = spf[0]!;
      const all = found.findIndex((t) => /^[~?+-]?all$/.test(t));
      const evaluated = all < 0 ? found : found.slice(0, all);
      return wanted.every((t) => evaluated.includes(t));
    }
    case 'dmarc':
      return published.some((txt) => /^v\s*=\s*dmarc1\s*(;|$)/i.test(txt.trim()));
    case 'return_path':
      return published.includes(record.value.toLowerCase().replace(/\.$/, ''));
  }
}

/** Looks every record up (fresh, not from the cache) and says what was found. */
export async function checkRecords(dns: DnsLookup, records: DomainDnsRecord[]): Promise<RecordCheck[]> {
  return Promise.all(
    records.map(async (record): Promise<RecordCheck> => {
      const label = `${LABELS[record.purpose]} ${record.type} record at ${record.name}`;
      const result = record.type === 'MX' ? await dns.mx(record.name) : await dns.txt(record.name);
      if (result.kind === 'temporary') {
        return { record, finding: 'temporary', detail: `${label} could not be looked up right now (${result.reason})` };
      }
      if (result.kind !== 'answer') return { record, finding: 'missing', detail: `${label} not found` };
      const published = result.records.map((r) => (typeof r === 'string' ? r : r.exchange));
      if (satisfies(record, published)) return { record, finding: 'found', detail: `${label} found` };
      return { record, finding: 'mismatch', detail: `${label} does not hold the expected value` };
    }),
  );
}

/**
 * Applies one round of lookups to the domain (the state table of docs/domains.md "Verification"):
 * PENDING -> VERIFIED when DKIM and SPF are found; PENDING -> FAILED 72 hours after the
 * request; VERIFIED -> PENDING when a required record disappears. A temporary DNS failure
 * changes no state and only reschedules.
 */
export function applyChecks(domain: Domain, checks: RecordCheck[], now: Date): void {
  const required = checks.filter((c) => REQUIRED.has(c.record.purpose));
  const allFound = required.every((c) => c.finding === 'found');
  const definitelyMissing = required.filter((c) => c.finding === 'missing' || c.finding === 'mismatch');
  const temporary = required.filter((c) => c.finding === 'temporary');
  const optionalMissing = checks.filter((c) => !REQUIRED.has(c.record.purpose) && c.finding !== 'found');

  let next: DomainStatus = domain.status;
  if (allFound) {
    next = 'VERIFIED';
  } else if (domain.status === 'VERIFIED') {
    // Only a definite absence demotes a verified domain; a DNS hiccup does not.
    if (definitelyMissing.length > 0) next = 'PENDING';
  } else if (domain.status === 'PENDING') {
    const since = domain.pendingSince ?? now;
    // docs/domains.md "Verification": FAILED after 72 hours pending, whatever kept it so: a name whose lookup has
    // failed for three days (a lame delegation, a broken zone) is as unverified as a wrong record.
    if (now.getTime() - since.getTime() >= PENDING_LIMIT_MS) next = 'FAILED';
  }

  const recordStatus = (c: RecordCheck): DomainStatus => {
    if (c.finding === 'found') return 'VERIFIED';
    if (next === 'FAILED' && REQUIRED.has(c.record.purpose)) return 'FAILED';
    if (c.finding === 'temporary') return c.record.status;
    return 'PENDING';
  };
  domain.dnsRecords = checks.map((c) => ({ ...c.record, status: recordStatus(c) }));
  domain.lastCheckedAt = now;

  if (allFound) {
    if (domain.status !== 'VERIFIED') domain.verifiedAt = now;
    domain.pendingSince = null;
    domain.message = null;
    domain.nextCheckAt = new Date(now.getTime() + VERIFIED_RECHECK_MS);
  } else if (next === 'VERIFIED') {
    // Still VERIFIED after a temporary failure: nothing for the user to do; look again soon.
    domain.message = null;
    domain.nextCheckAt = new Date(now.getTime() + 10 * MINUTE);
  } else if (next === 'FAILED') {
    domain.message = `Verification failed: the records were not found within 72 hours (${[...definitelyMissing, ...temporary].map((c) => c.detail).join('; ')}). Fix them and call verify again.`;
    domain.nextCheckAt = null;
  } else {
    const demoted = domain.status === 'VERIFIED';
    if (demoted) domain.pendingSince = now;
    const problems = [...definitelyMissing, ...temporary].map((c) => c.detail);
    const optional = optionalMissing.map((c) => `${c.detail} (optional)`);
    const prefix = demoted ? 'A required record is no longer published' : 'Waiting for DNS records';
    domain.message = `${prefix}: ${[...problems, ...optional].join('; ')}.`;
    domain.nextCheckAt = nextPendingCheck(domain.pendingSince ?? now, now);
  }
  if (!canTransition(domain.status, next)) throw new Error(`domain ${domain.id}: ${domain.status} -> ${next} is not allowed`);
  domain.status = next;
}

const checkable = (domain: Domain | null): domain is Domain => domain !== null && (domain.status === 'PENDING' || domain.status === 'VERIFIED');

/** One check of one domain, idempotent: a domain not PENDING or VERIFIED is left alone. */
export async function checkDomain(em: EntityManager, dns: DnsLookup, domainId: string, now = new Date()): Promise<Domain | null> {
  const found = await em.findOne(Domain, { id: domainId });
  if (!checkable(found)) return found;
  const checks = await checkRecords(dns, found.dnsRecords);
  // Applied to the row as it is once locked, after the lookups: two checks of the domain at
  // once (verify clicked twice) record its change once, and a domain deleted meanwhile is
  // left gone, without an event. domain.verified / domain.failed commit with the status
  // (webhook outbox); commit flushes.
  await em.begin();
  try {
    const domain = await em.findOne(Domain, { id: domainId }, { lockMode: LockMode.PESSIMISTIC_WRITE, refresh: true });
    if (checkable(domain)) {
      const previous = domain.status;
      applyChecks(domain, checks, now);
      await recordDomainStatus(em, domain, previous);
    }
    await em.commit();
    return domain;
  } catch (error) {
    await em.rollback();
    throw error;
  }
}

/** Ids of PENDING/VERIFIED domains whose next check is due, oldest first. */
export async function dueDomainIds(em: EntityManager, now: Date, limit: number): Promise<string[]> {
  const rows = await em.find(
    Domain,
    { status: { $in: ['PENDING', 'VERIFIED'] }, nextCheckAt: { $lte: now } },
    { fields: ['id'], orderBy: { nextCheckAt: 'asc' }, limit },
  );
  return rows.map((r) => r.id);
}

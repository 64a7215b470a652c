import type { Redis } from 'ioredis';
import type { DnsLookup } from '../dns/types.js';
import { newId } from '../ids.js';
import type { Logger } from '../logger.js';
import { ISSUE_CODES, issue, orderIssues, type Issue } from './codes.js';
import { MAILBOX_FULL_WINDOW_MS, RECURRING_BOUNCES, type HistoryRow } from './history.js';
import {
  domainCategory,
  isBlockedDomain,
  isDisposableDomain,
  isFreeProvider,
  isPrivacyAlias,
  isReservedDomain,
  isRoleLocalPart,
  isSpamLikeLocalPart,
  isSuspiciousTld,
  isTestLocalPart,
  type DomainCategory,
} from './lists.js';
import { lookupRouting, type LocalRoutingCache, type RoutingLookup } from './routing.js';
import type { VerificationStore } from './store.js';
import { parseAddress } from './syntax.js';
import { suggestDomain } from './typos.js';

/**
 * The verification of one address (docs/verification.md), shared by the API, the
 * CLI (through the API) and the tool catalog. Order: syntax and local lists (free), then the
 * quota (one atomic unit, read together with the history), then DNS routing (cached), then
 * the score. Nothing here throws for a property of the address: every problem is an issue.
 */
export interface VerificationDeps {
  store: VerificationStore;
  redis: Redis;
  dns: DnsLookup;
  clock: () => Date;
  /** Redis key of a domain's routing in the shared cache. */
  routingKey: (domain: string) => string;
  /** The process's copy of the hottest routing entries. */
  localRouting?: LocalRoutingCache;
  /** Operator blocklist (VERIFY_BLOCKED_DOMAINS): `spam_domain`. */
  blockedDomains: ReadonlySet<string>;
  /** Where a check that breaks is reported (the caller only sees `internal_error`). */
  logger?: Pick<Logger, 'error'>;
}

export type VerificationResultKind = 'deliverable' | 'risky' | 'undeliverable' | 'unknown';
export type VerificationStatus = 'completed' | 'skipped' | 'failed';

export interface VerificationTraits {
  domain_category: DomainCategory;
  disposable: boolean;
  free_provider: boolean;
  privacy_alias: boolean;
  role_based: boolean;
  suspicious_domain: boolean;
}

export interface VerificationResult {
  object: 'email_verification';
  id: string;
  email: string;
  result: VerificationResultKind;
  accept: boolean;
  status: VerificationStatus;
  score: number | null;
  suggestion: string | null;
  traits: VerificationTraits;
  issues: Issue[];
  quota: { limit: number; used: number; remaining: number; resets_at: string };
  retry_at: string | null;
  cache_hit: boolean;
}

/** Rule 5 of docs/verification.md. */
export const SCORE_CLEAN = 80;
export const SCORE_PROVEN = 100;
export const SCORE_DNS_UNKNOWN = 30;
/** When a temporary DNS failure or a broken check is worth retrying. */
export const DNS_RETRY_MS = 5 * 60 * 1000;
export const INTERNAL_RETRY_MS = 60 * 1000;

export function monthOf(now: Date): { month: string; resetsAt: Date } {
  const y = now.getUTCFullYear();
  const m = now.getUTCMonth();
  return { month: `${y}-${String(m + 1).padStart(2, '0')}-01`, resetsAt: new Date(Date.UTC(y, m + 1, 1)) };
}

function emptyTraits(): VerificationTraits {
  return { domain_category: 'unknown', disposable: false, free_provider: false, privacy_alias: false, role_based: false, suspicious_domain: false };
}

interface LocalFindings {
  issues: Issue[];
  traits: VerificationTraits;
  suggestion: string | null;
  /** A local error already rejects the address: DNS would tell nothing more. */
  rejected: boolean;
}

/** Every check that needs neither the database nor the network. */
export function localChecks(parsed: ReturnType<typeof parseAddress>, blocked: ReadonlySet<string>): LocalFindings {
  const issues: Issue[] = [];
  const domain = parsed.ok ? parsed.domain : null;
  const local = parsed.local;
  const traits = emptyTraits();
  let suggestion: string | null = null;
  if (!parsed.ok) issues.push(issue('invalid_format', `The address is not valid: ${parsed.reason}`));
  if (domain && local !== null) {
    const isBlocked = isBlockedDomain(blocked, domain);
    traits.privacy_alias = isPrivacyAlias(domain);
    traits.disposable = !traits.privacy_alias && isDisposableDomain(domain);
    traits.free_provider = isFreeProvider(domain);
    traits.role_based = isRoleLocalPart(local);
    traits.suspicious_domain = isSuspiciousTld(domain);
    traits.domain_category = domainCategory(domain, { blocked: isBlocked });
    if (isReservedDomain(domain)) issues.push(issue('test_email', `${domain} is reserved for documentation and tests and receives no mail`));
    else if (isTestLocalPart(local)) issues.push(issue('test_email', `"${local}" is a placeholder, not a real mailbox`));
    if (isBlocked) issues.push(issue('spam_domain', `${domain} is blocked by the operator of this service`));
    if (traits.disposable) issues.push(issue('disposable_email', `${domain} is a disposable (throwaway) mailbox provider`));
    if (traits.privacy_alias) issues.push(issue('privacy_alias', `${domain} is a privacy relay that forwards to a hidden mailbox`));
    if (traits.suspicious_domain) issues.push(issue('suspicious_domain', `Addresses on .${domain.split('.').pop()} domains are often abused`));
    if (traits.role_based) issues.push(issue('role_based', `"${local}" is a role mailbox, usually read by a team rather than a person`));
    if (isSpamLikeLocalPart(local)) issues.push(issue('spam_like', `"${local}" does not look like a mailbox a person chose`));
    const fixed = suggestDomain(domain);
    if (fixed && fixed !== domain) {
      suggestion = `${local}@${fixed}`;
      issues.push(issue('domain_typo', `${domain} looks like a typo of ${fixed}`));
    }
  }
  return { issues, traits, suggestion, rejected: issues.some((i) => i.severity === 'error') };
}

/** Issues from the trusted history; a later proof of the mailbox outweighs a bounce. */
export function historyIssues(h: HistoryRow, now: Date): { issues: Issue[]; proven: boolean; retryAt: Date | null; suspicious: boolean } {
  const issues: Issue[] = [];
  const proven = h.provenAt?.getTime() ?? 0;
  const after = (d: Date | null) => d !== null && d.getTime() > proven;
  let retryAt: Date | null = null;
  if (h.complainedAt) issues.push(issue('previously_complained', 'A recipient at this address marked our email as spam'));
  if (after(h.hardBouncedAt)) issues.push(issue('previously_bounced', 'Email to this address bounced permanently'));
  if (h.suppressed) issues.push(issue('globally_suppressed', 'This address is on the global suppression list'));
  if (after(h.mailboxNotFoundAt)) issues.push(issue('mailbox_not_found', 'The receiving server said this mailbox does not exist'));
  if (after(h.mailboxFullAt) && now.getTime() - h.mailboxFullAt!.getTime() < MAILBOX_FULL_WINDOW_MS) {
    issues.push(issue('mailbox_full', 'The mailbox was full at the last delivery attempt'));
    retryAt = new Date(h.mailboxFullAt!.getTime() + MAILBOX_FULL_WINDOW_MS);
  }
  if (h.catchAll) issues.push(issue('catch_all', 'The domain accepts mail for any address, so the mailbox cannot be confirmed'));
  const suspicious = h.domainBadAddresses >= RECURRING_BOUNCES;
  if (suspicious) issues.push(issue('suspicious_domain', 'Several other addresses on this domain bounced as unknown'));
  return { issues, proven: h.provenAt !== null && issues.every((i) => i.severity !== 'error'), retryAt, suspicious };
}

function routingIssues(domain: string, routing: RoutingLookup): Issue[] {
  switch (routing.outcome) {
    case 'nxdomain':
      return [issue('invalid_domain', `The domain ${domain} does not exist`)];
    case 'null_mx':
      return [issue('invalid_domain', `${domain} publishes a null MX (RFC 7505): it accepts no mail`)];
    case 'no_route':
      return [issue('invalid_domain', `${domain} has no mail destination (${routing.unresolvedMx ? 'none of its MX hosts has an address' : 'no MX, A or AAAA record'})`)];
    case 'temporary':
      return [issue('mailbox_unknown', `The mail routing of ${domain} could not be resolved right now`)];
    default:
      return [];
  }
}

/** Score, result and accept of rules 2, 3, 5 and 6 from the ordered issues. */
export function decide(issues: Issue[], opts: { proven: boolean; dnsUnknown: boolean; skipped: boolean; failed: boolean }) {
  const errors = issues.filter((i) => i.severity === 'error');
  // Rule 2: an error blocks; quota exhaustion is the one error that does not (rule 2, "accept
  // may be true when the quota is exhausted").
  const blocking = errors.filter((i) => i.code !== 'quota_exceeded');
  const accept = blocking.length === 0;
  if (opts.skipped || opts.failed) {
    return { score: null, accept, result: (blocking.some((i) => i.code !== 'internal_error') ? 'undeliverable' : 'unknown') as VerificationResultKind };
  }
  if (errors.length > 0) return { score: ISSUE_CODES[errors[0]!.code].score ?? 0, accept, result: 'undeliverable' as const };
  if (opts.dnsUnknown) return { score: SCORE_DNS_UNKNOWN, accept, result: 'unknown' as const };
  const reduction = issues.reduce((sum, i) => sum + (ISSUE_CODES[i.code].reduction ?? 0), 0);
  const score = Math.max(0, (opts.proven ? SCORE_PROVEN : SCORE_CLEAN) - reduction);
  return { score, accept, result: (opts.proven && score >= 90 ? 'deliverable' : 'risky') as VerificationResultKind };
}

const latest = (dates: Array<Date | null>) =>
  dates.reduce<Date | null>((max, d) => (d && (!max || d > max) ? d : max), null);

export async function verifyEmail(deps: VerificationDeps, input: { organizationId: string; email: string }): Promise<VerificationResult> {
  const now = deps.clock();
  const { month, resetsAt } = monthOf(now);
  // Echo and store at most this much of an impossible address.
  const parsed = parseAddress(input.email);
  let local: LocalFindings;
  let failed = false;
  const issues: Issue[] = [];
  try {
    local = localChecks(parsed, deps.blockedDomains);
  } catch (error) {
    deps.logger?.error({ err: error }, 'verification: local checks failed');
    failed = true;
    local = { issues: [], traits: emptyTraits(), suggestion: null, rejected: true };
    issues.push(issue('internal_error', 'A check failed inside the service; retry later'));
  }
  issues.push(...local.issues);
  const domain = parsed.ok ? parsed.domain : '';

  // Every call counts (docs/verification.md "Quota"), including invalid addresses. The history is
  // read in the same statement, and ignored when the quota is exhausted
  // (docs/verification.md "Quota").
  const { quota, history } = await deps.store.begin({
    organizationId: input.organizationId,
    month,
    email: parsed.ok ? parsed.email : null,
    domain: parsed.ok ? domain : null,
  });
  const skipped = !quota.consumed;
  let proven = false;
  let cacheHit = false;
  let dnsUnknown = false;
  const retryAts: Array<Date | null> = [];

  if (skipped) {
    issues.push(issue('quota_exceeded', `The monthly verification quota of ${quota.limit} is used up until ${resetsAt.toISOString()}`));
    retryAts.push(resetsAt);
  } else {
    if (history && parsed.ok) {
      const h = historyIssues(history, now);
      issues.push(...h.issues);
      proven = h.proven;
      if (h.suspicious) local.traits.suspicious_domain = true;
      retryAts.push(h.retryAt);
    }
    if (parsed.ok && !local.rejected) {
      try {
        const routing = await lookupRouting({ dns: deps.dns, redis: deps.redis, cacheKey: deps.routingKey, local: deps.localRouting }, domain);
        cacheHit = routing.cacheHit;
        issues.push(...routingIssues(domain, routing));
        if (routing.outcome === 'temporary') {
          dnsUnknown = true;
          retryAts.push(new Date(now.getTime() + DNS_RETRY_MS));
        }
      } catch (error) {
        // A broken resolver is the service's fault, not the address's: report it, keep the rest.
        deps.logger?.error({ err: error, domain }, 'verification: DNS routing check failed');
        failed = true;
        issues.push(issue('internal_error', 'A check failed inside the service; retry later'));
      }
    }
    if (failed) retryAts.push(new Date(now.getTime() + INTERNAL_RETRY_MS));
  }

  const ordered = orderIssues(issues);
  // A rejected address is not "unknown" because its DNS was: drop the warning's effect.
  const hasError = ordered.some((i) => i.severity === 'error');
  const decision = decide(ordered, { proven, dnsUnknown: dnsUnknown && !hasError, skipped, failed });
  const status: VerificationStatus = skipped ? 'skipped' : failed ? 'failed' : 'completed';
  const retryAt = ordered.some((i) => i.retryable) ? latest(retryAts) : null;
  const id = newId('ver');
  await deps.store.save({
    id,
    organizationId: input.organizationId,
    email: parsed.email,
    result: decision.result,
    accept: decision.accept,
    status,
    score: decision.score,
    suggestion: local.suggestion,
    traits: local.traits,
    issues: ordered,
    retryAt,
    cacheHit,
    createdAt: now,
  });
  return {
    object: 'email_verification',
    id,
    email: parsed.email,
    result: decision.result,
    accept: decision.accept,
    status,
    score: decision.score,
    suggestion: local.suggestion,
    traits: local.traits,
    issues: ordered,
    // A limit lowered below this month's use reports `used` at the limit
    // (docs/verification.md "Quota": used never exceeds limit).
    quota: { limit: quota.limit, used: Math.min(quota.used, quota.limit), remaining: Math.max(0, quota.limit - quota.used), resets_at: resetsAt.toISOString() },
    retry_at: retryAt ? retryAt.toISOString() : null,
    cache_hit: cacheHit,
  };
}

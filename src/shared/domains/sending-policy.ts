import type { EntityManager } from '@mikro-orm/postgresql';
import type { Redis } from 'ioredis';
import type { Config } from '../config.js';
import { Domain } from '../db/entities/domain.js';
import { ValidationError } from '../errors.js';
import { limitExceeded } from '../rate-limits/window.js';
import { addressDomain, normalizeHostname } from './hostname.js';

/**
 * The sending policy (docs/security.md "The sending policy"): the one check every path that sends
 * mail on behalf of an organization runs before it accepts the message — `POST /emails`, the batch,
 * a campaign's send (when scheduled and again when its fan-out starts), a campaign's test send, the
 * double opt-in confirmation, and SMTP submission. With ALLOW_UNVERIFIED_DOMAINS=false the From
 * domain must be a VERIFIED domain of the organization; adding a domain proves nothing until its
 * DNS records are checked, so without this a tenant could add `paypal.com` and send as
 * `service@paypal.com`.
 */

export type PolicyConfig = Pick<Config, 'allowUnverifiedDomains'>;

/** The address of `addr`, `Name <addr>` or a bare hostname, and its normalized domain. */
function fromDomain(from: string): { hostname: string | null; shown: string } {
  const address = /<([^<>]+)>\s*$/.exec(from)?.[1] ?? from;
  const hostname = address.includes('@') ? addressDomain(address) : normalizeHostname(address);
  return { hostname, shown: hostname ?? address.slice(address.lastIndexOf('@') + 1) };
}

/**
 * Why the organization may not send from `from`, or undefined when it may. `from` is an
 * address (`a@b`, `Name <a@b>`) or a hostname. A no-op (no query) while unverified domains
 * are allowed.
 */
export async function sendingPolicyProblem(em: EntityManager, config: PolicyConfig, organizationId: string, from: string): Promise<string | undefined> {
  if (config.allowUnverifiedDomains) return undefined;
  const { hostname, shown } = fromDomain(from);
  const domain = hostname ? await em.findOne(Domain, { organizationId, domain: hostname }, { fields: ['status'] }) : null;
  if (domain?.status === 'VERIFIED') return undefined;
  return `the sending domain ${shown} ${domain ? `is ${domain.status}, not VERIFIED` : 'is not a domain of this organization'}`;
}

/**
 * sendingPolicyProblem as the API's answer: a `validation_error` naming the field (`path`)
 * and the domain; `status` is 422, or 400 on routes whose validation errors are 400.
 */
export async function assertSendingAllowed(
  em: EntityManager,
  config: PolicyConfig,
  organizationId: string,
  from: string,
  path = 'from',
  status: 400 | 422 = 422,
): Promise<void> {
  await assertSendingAllowedForAll(em, config, organizationId, [{ from, path }], status);
}

/**
 * Why each of several senders may not send (the batch's items, a message's From and Sender
 * headers), in their order; each distinct domain is looked up once. Empty when all may.
 */
export async function sendingPolicyRefusals(
  em: EntityManager,
  config: PolicyConfig,
  organizationId: string,
  senders: { from: string; path: string }[],
  /** Stop at the first refusal (a message is refused whole: no lookup more than needed). */
  options: { first?: boolean } = {},
): Promise<{ path: string; message: string }[]> {
  if (config.allowUnverifiedDomains) return [];
  const problems = new Map<string, string | undefined>();
  const refusals: { path: string; message: string }[] = [];
  for (const { from, path } of senders) {
    const key = fromDomain(from).hostname ?? from;
    if (!problems.has(key)) problems.set(key, await sendingPolicyProblem(em, config, organizationId, from));
    const problem = problems.get(key);
    if (problem) refusals.push({ path, message: problem });
    if (problem && options.first) break;
  }
  return refusals;
}

/** assertSendingAllowed for several senders at once (the batch): every refused one is named in the error's details. */
export async function assertSendingAllowedForAll(
  em: EntityManager,
  config: PolicyConfig,
  organizationId: string,
  senders: { from: string; path: string }[],
  status: 400 | 422 = 422,
): Promise<void> {
  const details = await sendingPolicyRefusals(em, config, organizationId, senders);
  const [first] = details;
  if (first) throw new ValidationError(`${first.path}: ${first.message}`, details, status);
}

/**
 * A campaign's test send goes to any address with any content the tenant wrote: it is a
 * send path, so it needs `send` (route config) and is capped per organization and UTC
 * hour (TEST_SENDS_PER_HOUR recipients). Counted in Redis, shared by every API process.
 */
export async function takeTestSend(redis: Redis, config: Pick<Config, 'redisPrefix' | 'testSendsPerHour'>, organizationId: string, now: Date): Promise<void> {
  const hour = Math.floor(now.getTime() / 3_600_000);
  const key = [config.redisPrefix, 'test-sends', organizationId, String(hour)].join(':');
  const result = await redis.multi().incr(key).expire(key, 3_700).exec();
  if (result?.[0]?.[0]) throw result[0][0];
  const count = Number(result?.[0]?.[1] ?? 0);
  if (count > config.testSendsPerHour) {
    const retryAfter = Math.max(1, Math.ceil(((hour + 1) * 3_600_000 - now.getTime()) / 1000));
    // This limit's headers, not the per-second API limit's the request passed.
    throw limitExceeded({ limit: config.testSendsPerHour, remaining: 0, resetSeconds: retryAfter }, `At most ${config.testSendsPerHour} test emails an hour per organization; retry after ${retryAfter} s`);
  }
}

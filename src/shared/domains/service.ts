import { generateKeyPair } from 'node:crypto';
import { promisify } from 'node:util';
import { UniqueConstraintViolationException } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { SecretBox } from '../crypto.js';
import type { QueueProducer } from '../queues/producer.js';
import { Domain, Sender, type DomainDnsRecord } from '../db/entities/index.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import { lockForTransaction } from '../db/queries.js';
import { normalizeHostname } from './hostname.js';
import { countSendersByDomain } from './queries.js';
import { buildDnsRecords } from './records.js';

const generateKeyPairAsync = promisify(generateKeyPair);

export const DEFAULT_REGION = 'us-east-1';

export const NOT_STARTED_MESSAGE = 'Publish the DNS records, then call POST /api/v2/domains/{domain}/verify.';
export const CHECKING_MESSAGE = 'Verification requested: the DNS records are being checked.';

export interface DkimKeyPair {
  /** Base64 DER SubjectPublicKeyInfo, as the `p=` tag of the DKIM record wants it. */
  publicKey: string;
  /** PKCS#8 PEM. */
  privateKey: string;
}

/** RSA-2048: the size every receiver accepts and RFC 8301 recommends at least. */
export async function generateDkimKeyPair(): Promise<DkimKeyPair> {
  const { publicKey, privateKey } = await generateKeyPairAsync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'der' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  return { publicKey: publicKey.toString('base64'), privateKey };
}

/** Selector unique per domain registration (`mr` + the random tail of the id), so two
 * registrations of one hostname never publish at the same name. */
export function selectorFor(domainId: string): string {
  return `mr${domainId.slice(-8)}`;
}

export interface CreateDomainInput {
  domain: string;
  region?: string;
}

// The longest record name a domain publishes is its DKIM key's, `{selector}._domainkey.{domain}`:
// a DNS name has at most 253 characters, so a sending domain has 22 fewer.
const MAX_SENDING_DOMAIN_CHARS = 253 - `${selectorFor('_'.repeat(26))}._domainkey.`.length;

export function parseHostnameOrThrow(input: string, path = 'domain'): string {
  const hostname = normalizeHostname(input);
  if (!hostname) throw new ValidationError(`${path}: "${input}" is not a valid hostname`, [{ path, message: 'not a valid hostname' }]);
  return hostname;
}

export async function createDomain(
  em: EntityManager,
  box: SecretBox,
  organizationId: string,
  mailHost: string,
  input: CreateDomainInput,
  now = new Date(),
  /** MAX_DOMAINS_PER_ORGANIZATION: each new domain costs an RSA key generation. */
  maxDomains = Number.POSITIVE_INFINITY,
): Promise<Domain> {
  const hostname = parseHostnameOrThrow(input.domain);
  if (hostname.length > MAX_SENDING_DOMAIN_CHARS) {
    const message = `must be at most ${MAX_SENDING_DOMAIN_CHARS} characters (as punycode): its DKIM record name, {selector}._domainkey.{domain}, must fit in a DNS name's 253`;
    throw new ValidationError(`domain: ${message}`, [{ path: 'domain', message }]);
  }
  const duplicate = () =>
    new ValidationError(`domain: ${hostname} already exists in this organization`, [{ path: 'domain', message: 'already exists' }]);
  if (await em.count(Domain, { organizationId, domain: hostname })) throw duplicate();
  const tooMany = (count: number) =>
    new ValidationError(`domain: this organization has ${count} domains, the most allowed (MAX_DOMAINS_PER_ORGANIZATION); delete one first`, [
      { path: 'domain', message: 'too many domains in this organization' },
    ]);
  // Checked before the key is generated (the costly part), and again under a lock below.
  const existing = Number.isFinite(maxDomains) ? await em.count(Domain, { organizationId }) : 0;
  if (existing >= maxDomains) throw tooMany(existing);
  // Key generation (tens of ms) happens before the transaction, never inside it.
  const keys = await generateDkimKeyPair();
  const id = newId('dom');
  const selector = selectorFor(id);
  try {
    return await em.transactional(async (tx) => {
      if (Number.isFinite(maxDomains)) {
        await lockForTransaction(tx, `domain-cap:${organizationId}`);
        const count = await tx.count(Domain, { organizationId });
        if (count >= maxDomains) throw tooMany(count);
      }
      return tx.create(Domain, {
        id,
        organizationId,
        domain: hostname,
        region: input.region ?? DEFAULT_REGION,
        status: 'NOT_STARTED',
        dkimSelector: selector,
        dkimPrivateKeySealed: box.seal(keys.privateKey),
        dnsRecords: buildDnsRecords({ domain: hostname, selector, publicKey: keys.publicKey, mailHost }),
        mailProviderRecords: [],
        message: NOT_STARTED_MESSAGE,
        pendingSince: null,
        lastCheckedAt: null,
        nextCheckAt: null,
        verifiedAt: null,
        createdAt: now,
        updatedAt: now,
      });
    });
  } catch (error) {
    // Two concurrent creates of one hostname: the unique constraint decides.
    if (error instanceof UniqueConstraintViolationException) throw duplicate();
    throw error;
  }
}

/** `:domain` in a path: a `dom_` id or a hostname (Unicode or punycode). */
export async function findDomain(em: EntityManager, organizationId: string, idOrHostname: string): Promise<Domain> {
  let domain: Domain | null = null;
  if (isId(idOrHostname, 'dom')) {
    domain = await em.findOne(Domain, { id: idOrHostname, organizationId });
  } else {
    const hostname = normalizeHostname(idOrHostname);
    if (hostname) domain = await em.findOne(Domain, { domain: hostname, organizationId });
  }
  if (!domain) throw new NotFoundError(`Domain ${idOrHostname} not found`);
  return domain;
}

export interface DomainListItem {
  domain: Domain;
  emailSendersCount: number;
}

export async function listDomains(
  em: EntityManager,
  organizationId: string,
  limit: number | undefined,
): Promise<{ items: DomainListItem[]; hasMore: boolean }> {
  const rows = await em.find(
    Domain,
    { organizationId },
    { orderBy: { createdAt: 'desc', id: 'desc' }, limit: limit === undefined ? undefined : limit + 1 },
  );
  const hasMore = limit !== undefined && rows.length > limit;
  const page = hasMore ? rows.slice(0, limit) : rows;
  const counts = page.length > 0 ? await countSendersByDomain(em, page.map((d) => d.id)) : new Map<string, number>();
  return { items: page.map((domain) => ({ domain, emailSendersCount: counts.get(domain.id) ?? 0 })), hasMore };
}

export type VerificationRequest = { domain: Domain; enqueue: boolean };

/**
 * NOT_STARTED or FAILED -> PENDING (a new 72-hour window); PENDING stays PENDING; VERIFIED
 * stays VERIFIED. In every case the domain is due now, and the caller enqueues a check
 * after the commit.
 */
export async function requestVerification(em: EntityManager, organizationId: string, idOrHostname: string, now = new Date()): Promise<Domain> {
  return em.transactional(async (tx) => {
    const domain = await findDomain(tx, organizationId, idOrHostname);
    // A verified domain is only re-checked: it stays VERIFIED unless a record is gone.
    if (domain.status === 'NOT_STARTED' || domain.status === 'FAILED') {
      domain.status = 'PENDING';
      domain.pendingSince = now;
      domain.message = CHECKING_MESSAGE;
      domain.dnsRecords = domain.dnsRecords.map((r): DomainDnsRecord => ({ ...r, status: 'PENDING' }));
    }
    domain.nextCheckAt = now;
    return domain;
  });
}

/** Marks the domain PENDING, then (after the commit) asks a worker to check it at once. */
export async function verifyDomain(em: EntityManager, producer: QueueProducer, organizationId: string, idOrHostname: string, now: Date): Promise<Domain> {
  const domain = await requestVerification(em, organizationId, idOrHostname, now);
  // The job id is unique per request so a repeated verify checks again.
  await producer.add('domains', { name: 'check', data: { domainId: domain.id }, jobId: `check-${domain.id}-${now.getTime()}` });
  return domain;
}

export async function deleteDomain(em: EntityManager, organizationId: string, idOrHostname: string): Promise<Domain> {
  return em.transactional(async (tx) => {
    const domain = await findDomain(tx, organizationId, idOrHostname);
    // Senders on the domain go with it (foreign key on delete cascade).
    await tx.nativeDelete(Sender, { domainId: domain.id });
    // A delete of the same domain at the same time deleted it first: this one waited for it
    // and deletes nothing, so it answers 404 as any later delete does.
    if ((await tx.nativeDelete(Domain, { id: domain.id, organizationId })) === 0) throw new NotFoundError(`Domain ${idOrHostname} not found`);
    return domain;
  });
}

/** The host named in the records we hand out: the service's public host. */
export function mailHostOf(publicUrl: string): string {
  return new URL(publicUrl).hostname.toLowerCase();
}

import { UniqueConstraintViolationException } from '@mikro-orm/core';
import { LockMode, type EntityManager } from '@mikro-orm/postgresql';
import { Domain, Sender } from '../db/entities/index.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import { isAddress } from '../emails/addresses.js';
import { addressDomain } from './hostname.js';

export interface CreateSenderInput {
  name: string;
  email: string;
}

/** Lower-cases the address and writes its domain in ASCII (punycode). */
export function normalizeSenderEmail(email: string): { email: string; domain: string } | null {
  const trimmed = email.trim();
  const at = trimmed.lastIndexOf('@');
  const domain = addressDomain(trimmed);
  if (at <= 0 || !domain) return null;
  const address = `${trimmed.slice(0, at).toLowerCase()}@${domain}`;
  // One mailbox, as a send's `from` must be (isAddress): no list, no second @, no quoted or
  // broken local part, no line break. Only the domain was checked, and a campaign's From was
  // `service@paypal.com,news@acme.io`.
  return isAddress(address) ? { email: address, domain } : null;
}

/**
 * A sender on one of the organization's domains. `within`: the one domain it must be on (the
 * dashboard's form of a domain), else an address of another domain is refused naming it.
 */
export async function createSender(
  em: EntityManager,
  organizationId: string,
  input: CreateSenderInput,
  now = new Date(),
  within?: { id: string; domain: string },
): Promise<Sender> {
  const parsed = normalizeSenderEmail(input.email);
  if (!parsed) throw new ValidationError('email: not a valid address', [{ path: 'email', message: 'not a valid address' }]);
  if (within && parsed.domain !== within.domain) {
    const message = `must be an address at ${within.domain} (add a sender of another domain on that domain's page)`;
    throw new ValidationError(`email: ${message}`, [{ path: 'email', message }]);
  }
  const notADomain = () =>
    new ValidationError(`email: ${parsed.domain} is not a domain of this organization; add it with POST /api/v2/domains first`, [
      { path: 'email', message: `domain ${parsed.domain} is not a domain of this organization` },
    ]);
  const domain = within ?? (await em.findOne(Domain, { organizationId, domain: parsed.domain }, { fields: ['id'] }));
  if (!domain) throw notADomain();
  const duplicate = () =>
    new ValidationError(`email: a sender with the address ${parsed.email} already exists`, [{ path: 'email', message: 'already exists' }]);
  if (await em.count(Sender, { organizationId, email: parsed.email })) throw duplicate();
  try {
    return await em.transactional(async (tx) => {
      // The domain is locked for the insert: a delete of it at the same time either waits and
      // takes the new sender with it, or went first and this answers as if it were never there
      // (the foreign key is checked at commit, too late for a clear error).
      if (!(await tx.findOne(Domain, { id: domain.id, organizationId }, { fields: ['id'], lockMode: LockMode.PESSIMISTIC_READ }))) throw notADomain();
      return tx.create(Sender, { id: newId('snd'), organizationId, domainId: domain.id, name: input.name, email: parsed.email, createdAt: now });
    });
  } catch (error) {
    if (error instanceof UniqueConstraintViolationException) throw duplicate();
    throw error;
  }
}

export async function listSenders(
  em: EntityManager,
  organizationId: string,
  limit: number | undefined,
): Promise<{ items: Sender[]; hasMore: boolean }> {
  const rows = await em.find(
    Sender,
    { organizationId },
    { orderBy: { createdAt: 'desc', id: 'desc' }, limit: limit === undefined ? undefined : limit + 1 },
  );
  const hasMore = limit !== undefined && rows.length > limit;
  return { items: hasMore ? rows.slice(0, limit) : rows, hasMore };
}

/** A sender of the organization by id (campaigns resolve `senderId` through this too). */
export async function getSender(em: EntityManager, organizationId: string, id: string): Promise<Sender> {
  const sender = isId(id, 'snd') ? await em.findOne(Sender, { id, organizationId }) : null;
  if (!sender) throw new NotFoundError(`Sender ${id} not found`);
  return sender;
}

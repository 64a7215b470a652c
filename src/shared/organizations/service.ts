import type { EntityManager } from '@mikro-orm/postgresql';
import type { SecretBox } from '../crypto.js';
import { Organization } from '../db/entities/index.js';
import { NotFoundError } from '../errors.js';
import { newId } from '../ids.js';
import { insertToken } from '../tokens/service.js';

export interface CreateOrganizationInput {
  name: string;
  doubleOptIn?: boolean;
  verifyQuota: number;
}

export interface CreatedOrganization {
  organization: Organization;
  token: { id: string; token: string; permissions: string[] };
}

/** An organization and its first token (permissions `*`), in one transaction. */
export async function createOrganization(
  em: EntityManager,
  box: SecretBox,
  input: CreateOrganizationInput,
): Promise<CreatedOrganization> {
  return em.transactional(async (tx) => {
    const now = new Date();
    const organization = tx.create(Organization, {
      id: newId('org'),
      name: input.name,
      doubleOptIn: input.doubleOptIn ?? false,
      verifyQuota: input.verifyQuota,
      trackOpens: true,
      trackClicks: true,
      createdAt: now,
      updatedAt: now,
    });
    const { entity, secret } = insertToken(tx, box, { organizationId: organization.id, name: 'default', permissions: ['*'] });
    return { organization, token: { id: entity.id, token: secret, permissions: entity.permissions } };
  });
}

export interface UpdateOrganizationInput {
  name?: string;
  doubleOptIn?: boolean;
  verifyQuota?: number;
  trackOpens?: boolean;
  trackClicks?: boolean;
}

/** An organization by id; NotFoundError when there is none (one deleted under a signed-in session). */
export async function getOrganization(em: EntityManager, id: string): Promise<Organization> {
  const organization = await em.findOne(Organization, { id });
  if (!organization) throw new NotFoundError(`No organization ${id}`);
  return organization;
}

export async function updateOrganization(em: EntityManager, id: string, input: UpdateOrganizationInput): Promise<Organization> {
  return em.transactional(async (tx) => {
    const organization = await tx.findOne(Organization, { id });
    if (!organization) throw new NotFoundError(`No organization ${id}`);
    for (const [key, value] of Object.entries(input)) {
      if (value !== undefined) (organization as unknown as Record<string, unknown>)[key] = value;
    }
    return organization;
  });
}

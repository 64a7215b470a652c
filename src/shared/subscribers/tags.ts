import type { EntityManager } from '@mikro-orm/postgresql';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import { renameTagInFilters } from '../campaigns/queries.js';
import * as q from './queries.js';
import type { TagRef } from './rows.js';

/** Tags of an organization (docs/audience.md). Names are unique regardless of case. */

function taken(name: string): ValidationError {
  return new ValidationError(`A tag named "${name}" already exists`, [{ path: 'name', message: 'is already taken' }]);
}

export async function listTags(em: EntityManager, organizationId: string): Promise<TagRef[]> {
  return q.selectTags(em, organizationId);
}

/** `:tag` of a path: an id, or the current name (any case). */
export async function findTag(em: EntityManager, organizationId: string, ref: string): Promise<TagRef | null> {
  const found = isId(ref, 'tag') ? await q.selectTagById(em, organizationId, ref) : undefined;
  if (found) return found;
  return (await q.selectTagByName(em, organizationId, ref.trim())) ?? null;
}

export async function getTag(em: EntityManager, organizationId: string, ref: string): Promise<TagRef> {
  const tag = await findTag(em, organizationId, ref);
  if (!tag) throw new NotFoundError(`No tag ${ref}`);
  return tag;
}

export async function createTag(em: EntityManager, organizationId: string, name: string, now: Date): Promise<TagRef> {
  const inserted = await q.insertTag(em, { id: newId('tag'), organizationId, name, now });
  if (!inserted) throw taken(name);
  return inserted;
}

export async function renameTag(em: EntityManager, organizationId: string, ref: string, name: string, now: Date): Promise<TagRef> {
  const tag = await getTag(em, organizationId, ref);
  try {
    return await em.transactional(async (tx) => {
      const updated = await q.updateTagName(tx, tag.id, name, now);
      if (!updated) throw new NotFoundError(`No tag ${ref}`);
      // Campaigns filter by a tag's name: theirs follow it, or a rename would retarget them
      // (a scheduled "not_has vip" would mail the VIPs it excluded). From the name read under
      // the lock: two renames at once each move the filters from the name the other left.
      if (updated.previous !== name) await renameTagInFilters(tx, organizationId, updated.previous, name);
      return { id: updated.id, name: updated.name };
    });
  } catch (error) {
    if ((error as { code?: string }).code === '23505' || (error as { name?: string }).name === 'UniqueConstraintViolationException') {
      throw taken(name);
    }
    throw error;
  }
}

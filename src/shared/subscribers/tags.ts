import type { EntityManager } from '@mikro-orm/postgresql';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import type { TagRef } from './rows.js';

/** Tags of an organization (spec 2.4, 4.7; contract 7). Names are unique regardless of case. */

async function rows<T>(em: EntityManager, sql: string, params: unknown[]): Promise<T[]> {
  return (await em.execute(sql, params as never[])) as T[];
}

function taken(name: string): ValidationError {
  return new ValidationError(`A tag named "${name}" already exists`, [{ path: 'name', message: 'is already taken' }]);
}

export async function listTags(em: EntityManager, organizationId: string): Promise<TagRef[]> {
  return rows<TagRef>(em, 'select id, name from tags where organization_id = ? order by lower(name), id', [organizationId]);
}

/** `:tag` of a path: an id, or the current name (any case). */
export async function findTag(em: EntityManager, organizationId: string, ref: string): Promise<TagRef | null> {
  const found = isId(ref, 'tag')
    ? await rows<TagRef>(em, 'select id, name from tags where organization_id = ? and id = ?', [organizationId, ref])
    : [];
  if (found[0]) return found[0];
  const byName = await rows<TagRef>(em, 'select id, name from tags where organization_id = ? and lower(name) = lower(?)', [
    organizationId,
    ref.trim(),
  ]);
  return byName[0] ?? null;
}

export async function getTag(em: EntityManager, organizationId: string, ref: string): Promise<TagRef> {
  const tag = await findTag(em, organizationId, ref);
  if (!tag) throw new NotFoundError(`No tag ${ref}`);
  return tag;
}

export async function createTag(em: EntityManager, organizationId: string, name: string, now: Date): Promise<TagRef> {
  const inserted = await rows<TagRef>(
    em,
    `insert into tags (id, organization_id, name, created_at, updated_at) values (?, ?, ?, ?, ?)
     on conflict (organization_id, lower(name)) do nothing returning id, name`,
    [newId('tag'), organizationId, name, now, now],
  );
  if (!inserted[0]) throw taken(name);
  return inserted[0];
}

export async function renameTag(em: EntityManager, organizationId: string, ref: string, name: string, now: Date): Promise<TagRef> {
  const tag = await getTag(em, organizationId, ref);
  try {
    const updated = await rows<TagRef>(em, 'update tags set name = ?, updated_at = ? where id = ? returning id, name', [name, now, tag.id]);
    if (!updated[0]) throw new NotFoundError(`No tag ${ref}`);
    return updated[0];
  } catch (error) {
    if ((error as { code?: string }).code === '23505' || (error as { name?: string }).name === 'UniqueConstraintViolationException') {
      throw taken(name);
    }
    throw error;
  }
}

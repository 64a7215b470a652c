import type { EntityName, FilterQuery, FindOptions } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';
import { ValidationError } from '../errors.js';

/** A list's page request (docs/foundation.md "Identifiers, time and lists"). */
interface CursorQuery {
  limit: number;
  /** An id of the list: the items older than it. */
  after?: string;
  /** An id of the list: the `limit` items just newer than it, still newest first. */
  before?: string;
}

/** `after` or `before`, not both: 422 (every list that takes both). */
export function assertOneCursor(query: { after?: string; before?: string }): void {
  if (query.after !== undefined && query.before !== undefined) {
    throw new ValidationError('Pass after or before, not both', [{ path: 'after', message: 'cannot be combined with before' }]);
  }
}

/**
 * A page of `limit` items from `limit + 1` rows read newest first, or oldest first from a
 * `before` cursor (`upwards`): those are reversed, and the extra row, the newest, is left out.
 */
export function pageOf<T>(rows: T[], limit: number, upwards: boolean): { items: T[]; hasMore: boolean } {
  const items = rows.slice(0, limit);
  return { items: upwards ? items.reverse() : items, hasMore: rows.length > limit };
}

/**
 * One page of a list ordered newest first by id (ULIDs sort by creation), with the id
 * cursors of every v2 list that takes them: `after` and `before` not both, and a cursor that
 * is not in `scope` (another organization's id, an unknown one) is 422 naming it, with
 * `noun` ("email", "campaign") in the message. `filters` narrow the page, not the cursor: an
 * item whose status moved since the last page is still a cursor.
 */
export async function pageByIdCursor<T extends { id: string }, Row = T>(
  em: EntityManager,
  entity: EntityName<T>,
  { scope, filters }: { scope: FilterQuery<T>; filters?: FilterQuery<T> },
  query: CursorQuery,
  noun: string,
  /** Columns left out of the rows (`Row` is then the partial entity the caller reads). */
  exclude: readonly (keyof T & string)[] = [],
): Promise<{ items: Row[]; hasMore: boolean }> {
  const options = (exclude.length > 0 ? { exclude } : {}) as FindOptions<T>;
  assertOneCursor(query);
  const where = (filters ? { $and: [scope, filters] } : scope) as FilterQuery<T>;
  const cursor = query.after ?? query.before;
  if (cursor !== undefined) {
    const field = query.after !== undefined ? 'after' : 'before';
    const found = await em.count(entity, { $and: [scope, { id: cursor }] } as FilterQuery<T>);
    if (found === 0) throw new ValidationError(`${field}: no ${noun} ${cursor} in this organization`, [{ path: field, message: `no ${noun} ${cursor} in this organization` }]);
  }
  const { limit } = query;
  if (query.before !== undefined) {
    const rows = await em.find(entity, { $and: [where, { id: { $gt: query.before } }] } as FilterQuery<T>, { ...options, orderBy: { id: 'asc' }, limit: limit + 1 } as FindOptions<T>);
    return pageOf(rows as Row[], limit, true);
  }
  const filter = query.after !== undefined ? ({ $and: [where, { id: { $lt: query.after } }] } as FilterQuery<T>) : where;
  const rows = await em.find(entity, filter, { ...options, orderBy: { id: 'desc' }, limit: limit + 1 } as FindOptions<T>);
  return pageOf(rows as Row[], limit, false);
}

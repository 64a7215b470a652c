import type { EntityManager } from '@mikro-orm/postgresql';
import type { SubscriberStatus } from '../db/entities/index.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import type { QueueProducer } from '../queues/producer.js';
import { cleanFields, cleanTagNames, normalizeEmail } from './input.js';
import { byName, toRecord, type SubscriberRecord, type SubscriberRow, type TagRef } from './rows.js';
import { nextStatus, UNSUBSCRIBABLE } from './states.js';
import { inTransaction, rows, withConnection, type Db } from './sql.js';
import type { WorkflowEvent } from './workflow-events.js';
import { recordContactChange } from '../webhooks/queries.js';

/**
 * Subscriber writes wait for the WAL flush like every other write: an acknowledged
 * subscriber must survive a PostgreSQL crash. `true` would trade the last fraction of a
 * second of acknowledged upserts for about twice the create throughput (docs/audience.md).
 */
const ASYNC_COMMIT = false;

/** What the audience functions need, passed explicitly (STYLE 3). */
export interface AudienceDeps {
  em: EntityManager;
  producer: QueueProducer;
  clock: () => Date;
}

/** Body of create (spec 4.4) and patch (spec 4.6), already validated. */
export interface SubscriberInput {
  email?: string;
  name?: string | null;
  phone?: string | null;
  tags?: string[];
  fields?: Record<string, string | null>;
  replaceTags?: boolean;
  resubscribe?: boolean;
  triggerWorkflows?: boolean;
  skipDoubleOptIn?: boolean;
  ipAddress?: string;
  country?: string;
}

export interface WriteResult {
  subscriber: SubscriberRecord;
  /** Present only when some tag or field was not applied (contract 6). */
  warnings: string[];
}


/**
 * Arrays travel as one jsonb parameter (the SQL layer would spread a JS array into a list)
 * and are compared with `= any(array(select ...))`, which the planner turns into an index
 * lookup; `in (select ...)` would scan the whole table.
 */
function jsonArray(values: readonly string[]): string {
  return JSON.stringify(values);
}

function isUniqueViolation(error: unknown): boolean {
  let current = error as { code?: string; cause?: unknown; name?: string } | undefined;
  for (let depth = 0; current && depth < 4; depth++) {
    if (current.code === '23505' || current.name === 'UniqueConstraintViolationException') return true;
    current = current.cause as typeof current;
  }
  return false;
}

// ---------------------------------------------------------------- lookups

/** `:subscriber` of a path: an id or an address (contract 6). Optionally locks the row. */
export async function findSubscriberRow(em: Db, organizationId: string, ref: string, lock = false): Promise<SubscriberRow | null> {
  const byId = isId(ref, 'sub');
  const found = await rows<SubscriberRow>(
    em,
    `select * from subscribers where organization_id = ? and ${byId ? 'id' : 'email'} = ?${lock ? ' for update' : ''}`,
    [organizationId, byId ? ref : normalizeEmail(ref)],
  );
  return found[0] ?? null;
}

async function requireSubscriberRow(em: Db, organizationId: string, ref: string, lock = false): Promise<SubscriberRow> {
  const row = await findSubscriberRow(em, organizationId, ref, lock);
  if (!row) throw new NotFoundError(`No subscriber ${ref}`);
  return row;
}

export async function tagsOf(em: Db, subscriberIds: readonly string[]): Promise<Map<string, TagRef[]>> {
  const result = new Map<string, TagRef[]>(subscriberIds.map((id) => [id, []]));
  if (subscriberIds.length === 0) return result;
  const found = await rows<{ subscriber_id: string; id: string; name: string }>(
    em,
    `select st.subscriber_id, t.id, t.name from subscriber_tags st join tags t on t.id = st.tag_id
      where st.subscriber_id = any(array(select jsonb_array_elements_text(?::jsonb)))`,
    [jsonArray(subscriberIds)],
  );
  for (const row of found) result.get(row.subscriber_id)?.push({ id: row.id, name: row.name });
  for (const list of result.values()) list.sort(byName);
  return result;
}

export async function getSubscriber(em: EntityManager, organizationId: string, ref: string): Promise<SubscriberRecord> {
  const row = await requireSubscriberRow(em, organizationId, ref);
  return toRecord(row, (await tagsOf(em, [row.id])).get(row.id) ?? []);
}

// ---------------------------------------------------------------- tags of a subscriber

/**
 * The tags of these names, created when missing. Names are handled in one order (by lower
 * case) so two writers creating the same tags never wait on each other in a cycle; a tag a
 * concurrent transaction is creating is waited for, then read once it is committed.
 */
export async function ensureTags(em: Db, organizationId: string, names: readonly string[], now: Date): Promise<TagRef[]> {
  if (names.length === 0) return [];
  const sorted = [...names].sort((a, b) => (a.toLowerCase() < b.toLowerCase() ? -1 : 1));
  const select = () =>
    rows<TagRef>(
      em,
      `select id, name from tags where organization_id = ? and lower(name) = any(array(select lower(jsonb_array_elements_text(?::jsonb))))`,
      [organizationId, jsonArray(sorted)],
    );
  // Most writes name tags that exist: one read, and no insert at all.
  const found = await select();
  const have = new Set(found.map((t) => t.name.toLowerCase()));
  const missing = sorted.filter((name) => !have.has(name.toLowerCase()));
  if (missing.length === 0) return found;
  await rows(
    em,
    `insert into tags (id, organization_id, name, created_at, updated_at)
     select n.id, ?, n.name, ?, ? from jsonb_to_recordset(?::jsonb) as n(id text, name text, ord int) order by n.ord
     on conflict (organization_id, lower(name)) do nothing`,
    [organizationId, now, now, JSON.stringify(missing.map((name, ord) => ({ id: newId('tag'), name, ord })))],
  );
  return select();
}

interface TagChanges {
  added: TagRef[];
  removed: TagRef[];
}

async function attachTags(em: Db, subscriberId: string, tags: readonly TagRef[], now: Date): Promise<TagRef[]> {
  if (tags.length === 0) return [];
  const inserted = await rows<{ tag_id: string }>(
    em,
    `insert into subscriber_tags (subscriber_id, tag_id, created_at)
     select ?, t, ? from jsonb_array_elements_text(?::jsonb) as t
     on conflict do nothing returning tag_id`,
    [subscriberId, now, jsonArray(tags.map((t) => t.id))],
  );
  const ids = new Set(inserted.map((r) => r.tag_id));
  return tags.filter((t) => ids.has(t.id));
}

async function detachTags(em: Db, subscriberId: string, where: 'keep' | 'drop', tagIds: readonly string[]): Promise<TagRef[]> {
  return rows<TagRef>(
    em,
    `with gone as (
       delete from subscriber_tags where subscriber_id = ?
         and ${where === 'keep' ? 'not' : ''} (tag_id = any(array(select jsonb_array_elements_text(?::jsonb))))
       returning tag_id)
     select t.id, t.name from gone join tags t on t.id = gone.tag_id`,
    [subscriberId, jsonArray(tagIds)],
  );
}

async function tagIdsByName(em: Db, organizationId: string, names: readonly string[]): Promise<string[]> {
  if (names.length === 0) return [];
  const found = await rows<{ id: string }>(
    em,
    `select id from tags where organization_id = ? and lower(name) = any(array(select lower(jsonb_array_elements_text(?::jsonb))))`,
    [organizationId, jsonArray(names)],
  );
  return found.map((r) => r.id);
}

// ---------------------------------------------------------------- writes

type Operation = 'create' | 'patch';

interface WriteRequest {
  operation: Operation;
  /** Patch: the `:subscriber` of the path. */
  ref?: string;
  input: SubscriberInput;
  /** `DELETE /subscribers/{s}/tags`: names to detach (instead of `input.tags`). */
  removeTags?: string[];
  unsubscribe?: boolean;
}

interface Outcome {
  row: SubscriberRow;
  tags: TagRef[];
  events: WorkflowEvent[];
  becamePending: boolean;
}

const INSERT_NEW = `
  insert into subscribers (id, organization_id, email, name, phone, status, fields, signup_ip, signup_country, created_at, updated_at)
  select ?, o.id, ?, ?, ?,
         case when o.double_opt_in and not ? then 'PENDING_CONFIRMATION' else 'SUBSCRIBED' end,
         ?::jsonb, ?, ?, ?, ?
    from organizations o where o.id = ?
  on conflict (organization_id, email) do nothing
  returning *`;

/**
 * Create-or-upsert, patch, tag changes and unsubscribe: one path, so every write applies
 * the same rules. Concurrent creates of one address are safe: the insert waits for a
 * concurrent insert of the same address, then the existing row is locked and updated, so
 * there is one row and no tag is lost.
 */
async function write(deps: AudienceDeps, organizationId: string, request: WriteRequest): Promise<WriteResult> {
  const { input, operation } = request;
  const tagInput = cleanTagNames(request.removeTags ?? input.tags);
  const fieldInput = cleanFields(input.fields);
  const warnings = [...tagInput.warnings, ...fieldInput.warnings];
  const newEmail = input.email === undefined ? undefined : normalizeEmail(input.email);
  const now = deps.clock();

  let outcome: Outcome;
  try {
    outcome = await inTransaction(deps.em, async (tx) => {
      const events: WorkflowEvent[] = [];
      let row: SubscriberRow | undefined;
      let created = false;

      if (operation === 'create') {
        const inserted = await rows<SubscriberRow>(tx, INSERT_NEW, [
          newId('sub'),
          newEmail,
          input.name ?? null,
          input.phone ?? null,
          input.skipDoubleOptIn === true,
          JSON.stringify(fieldInput.set),
          input.ipAddress ?? null,
          input.country ?? null,
          now,
          now,
          organizationId,
        ]);
        row = inserted[0];
        created = row !== undefined;
        if (row) {
          events.push({ name: 'subscriber.created', data: { status: row.status } });
          for (const [field, value] of Object.entries(fieldInput.set)) events.push({ name: 'subscriber.field_updated', data: { field, value } });
        }
      }

      let becamePending = row?.status === 'PENDING_CONFIRMATION';
      if (!row) {
        const found = await rows<SubscriberRow & { double_opt_in: boolean }>(
          tx,
          `select s.*, o.double_opt_in from subscribers s join organizations o on o.id = s.organization_id
            where s.organization_id = ? and ${operation === 'create' || !isId(request.ref ?? '', 'sub') ? 's.email' : 's.id'} = ?
            for update of s`,
          [organizationId, operation === 'create' ? newEmail : isId(request.ref ?? '', 'sub') ? request.ref : normalizeEmail(request.ref ?? '')],
        );
        const existing = found[0];
        if (!existing) {
          if (operation === 'create') throw new Error('organization not found for a subscriber write');
          throw new NotFoundError(`No subscriber ${request.ref}`);
        }
        const updated = await updateExisting(tx, existing, request, fieldInput, newEmail, existing.double_opt_in, now, events);
        row = updated.row;
        becamePending = updated.becamePending;
      }

      // Tags after the status: a promotion (skipDoubleOptIn) is in place before tag events.
      const changes: TagChanges = { added: [], removed: [] };
      if (request.removeTags) {
        const ids = await tagIdsByName(tx, organizationId, tagInput.names);
        if (ids.length > 0) changes.removed = await detachTags(tx, row.id, 'drop', ids);
      } else if (input.tags !== undefined || input.replaceTags === true) {
        const tags = await ensureTags(tx, organizationId, tagInput.names, now);
        changes.added = await attachTags(tx, row.id, tags, now);
        if (input.replaceTags === true) {
          changes.removed = await detachTags(tx, row.id, 'keep', tags.map((t) => t.id));
        }
      }
      for (const tag of changes.added.sort(byName)) events.push({ name: 'subscriber.tag_added', data: { tag } });
      for (const tag of changes.removed.sort(byName)) events.push({ name: 'subscriber.tag_removed', data: { tag } });
      if ((changes.added.length > 0 || changes.removed.length > 0) && new Date(row.updated_at).getTime() !== now.getTime()) {
        row = (await rows<SubscriberRow>(tx, 'update subscribers set updated_at = ? where id = ? returning *', [now, row.id]))[0];
      }

      // A new row has exactly the tags just attached; an existing one is read back.
      const tags = created ? [...changes.added].sort(byName) : ((await tagsOf(tx, [row.id])).get(row.id) ?? []);
      await recordContactChange(tx, { created, changes: events, subscriber: toRecord(row, tags) });
      // Field events after tag events, in name order.
      const fieldEvents = events.filter((e) => e.name === 'subscriber.field_updated');
      const ordered = [
        ...events.filter((e) => e.name !== 'subscriber.field_updated'),
        ...fieldEvents.sort((a, b) => String(a.data.field).localeCompare(String(b.data.field))),
      ];
      return { row, tags, events: ordered, becamePending };
    }, { asyncCommit: ASYNC_COMMIT });
  } catch (error) {
    if (isUniqueViolation(error) && newEmail !== undefined && operation === 'patch') {
      throw new ValidationError('Another subscriber already has this address', [{ path: 'email', message: 'is already taken' }]);
    }
    throw error;
  }

  await afterCommit(deps, organizationId, outcome, input.triggerWorkflows === true, now);
  return { subscriber: toRecord(outcome.row, outcome.tags), warnings };
}

async function updateExisting(
  tx: Db,
  existing: SubscriberRow,
  request: WriteRequest,
  fieldInput: ReturnType<typeof cleanFields>,
  newEmail: string | undefined,
  doubleOptIn: boolean,
  now: Date,
  events: WorkflowEvent[],
): Promise<{ row: SubscriberRow; becamePending: boolean }> {
  const { input, operation } = request;
  const sets: string[] = [];
  const params: unknown[] = [];
  const set = (column: string, value: unknown, cast = '') => {
    sets.push(`${column} = ?${cast}`);
    params.push(value);
  };

  const status: SubscriberStatus = request.unsubscribe
    ? UNSUBSCRIBABLE.includes(existing.status)
      ? 'UNSUBSCRIBED'
      : existing.status
    : nextStatus({
        current: existing.status,
        operation,
        resubscribe: input.resubscribe,
        skipDoubleOptIn: input.skipDoubleOptIn,
        doubleOptIn,
      });
  if (status !== existing.status) {
    set('status', status);
    if (status === 'UNSUBSCRIBED') set('unsubscribed_at', now);
    events.push({
      name: status === 'SUBSCRIBED' ? 'subscriber.subscribed' : status === 'UNSUBSCRIBED' ? 'subscriber.unsubscribed' : 'subscriber.updated',
      data: { status, previousStatus: existing.status },
    });
  }

  const changed: string[] = [];
  if (operation === 'patch' && newEmail !== undefined && newEmail !== existing.email) {
    const taken = await rows(tx, 'select 1 from subscribers where organization_id = ? and email = ?', [existing.organization_id, newEmail]);
    if (taken.length > 0) {
      throw new ValidationError('Another subscriber already has this address', [{ path: 'email', message: 'is already taken' }]);
    }
    set('email', newEmail);
    changed.push('email');
  }
  if (input.name !== undefined && input.name !== existing.name) {
    set('name', input.name);
    changed.push('name');
  }
  if (input.phone !== undefined && input.phone !== existing.phone) {
    set('phone', input.phone);
    changed.push('phone');
  }
  if (input.ipAddress !== undefined && input.ipAddress !== existing.signup_ip) set('signup_ip', input.ipAddress);
  if (input.country !== undefined && input.country !== existing.signup_country) set('signup_country', input.country);
  if (changed.length > 0) events.push({ name: 'subscriber.updated', data: { changed } });

  const fields = { ...(existing.fields ?? {}) };
  let fieldsChanged = false;
  for (const [field, value] of Object.entries(fieldInput.set)) {
    if (fields[field] === value) continue;
    fields[field] = value;
    fieldsChanged = true;
    events.push({ name: 'subscriber.field_updated', data: { field, value } });
  }
  for (const field of fieldInput.remove) {
    if (!(field in fields)) continue;
    delete fields[field];
    fieldsChanged = true;
    events.push({ name: 'subscriber.field_updated', data: { field, value: null } });
  }
  if (fieldsChanged) set('fields', JSON.stringify(fields), '::jsonb');

  if (sets.length === 0) return { row: existing, becamePending: false };
  set('updated_at', now);
  const updated = await rows<SubscriberRow>(tx, `update subscribers set ${sets.join(', ')} where id = ? returning *`, [...params, existing.id]);
  return { row: updated[0], becamePending: status === 'PENDING_CONFIRMATION' && existing.status !== 'PENDING_CONFIRMATION' };
}

/** Jobs of a committed write: the confirmation email, then the workflow events in order. */
async function afterCommit(deps: AudienceDeps, organizationId: string, outcome: Outcome, triggerWorkflows: boolean, now: Date): Promise<void> {
  if (outcome.becamePending) {
    await deps.producer.add('subscribers', {
      name: 'send-confirmation',
      data: { subscriberId: outcome.row.id },
      jobId: `confirm-${outcome.row.id}`,
    });
  }
  if (triggerWorkflows && outcome.events.length > 0) {
    await deps.producer.addBulk(
      'workflows',
      outcome.events.map((event) => {
        const eventId = newId('evt');
        return {
          name: event.name,
          data: { eventId, organizationId, subscriberId: outcome.row.id, occurredAt: now.toISOString(), data: event.data },
          jobId: eventId,
        };
      }),
    );
  }
}

export function createSubscriber(deps: AudienceDeps, organizationId: string, input: SubscriberInput & { email: string }): Promise<WriteResult> {
  return write(deps, organizationId, { operation: 'create', input });
}

export function patchSubscriber(deps: AudienceDeps, organizationId: string, ref: string, input: SubscriberInput): Promise<WriteResult> {
  return write(deps, organizationId, { operation: 'patch', ref, input });
}

export function addSubscriberTags(
  deps: AudienceDeps,
  organizationId: string,
  ref: string,
  input: { tags: string[]; triggerWorkflows?: boolean },
): Promise<WriteResult> {
  return write(deps, organizationId, { operation: 'patch', ref, input: { tags: input.tags, triggerWorkflows: input.triggerWorkflows } });
}

export function removeSubscriberTags(
  deps: AudienceDeps,
  organizationId: string,
  ref: string,
  input: { tags: string[]; triggerWorkflows?: boolean },
): Promise<WriteResult> {
  return write(deps, organizationId, { operation: 'patch', ref, input: { triggerWorkflows: input.triggerWorkflows }, removeTags: input.tags });
}

/** Unsubscribe keeps tags and fields; BOUNCED, COMPLAINED and BANNED stay as they are. */
export function unsubscribeSubscriber(
  deps: AudienceDeps,
  organizationId: string,
  ref: string,
  input: { triggerWorkflows?: boolean },
): Promise<WriteResult> {
  return write(deps, organizationId, { operation: 'patch', ref, input: { triggerWorkflows: input.triggerWorkflows }, unsubscribe: true });
}

// ---------------------------------------------------------------- list

export interface ListSubscribersQuery {
  limit: number;
  after?: string;
  status?: SubscriberStatus;
  tag?: string;
  query?: string;
}

/** Newest first, keyset on the id (contract 6). */
export async function listSubscribers(
  em: EntityManager,
  organizationId: string,
  q: ListSubscribersQuery,
): Promise<{ items: SubscriberRecord[]; hasMore: boolean }> {
  return withConnection(em, (sql) => listOn(sql, organizationId, q));
}

async function listOn(em: Db, organizationId: string, q: ListSubscribersQuery): Promise<{ items: SubscriberRecord[]; hasMore: boolean }> {
  const where = ['s.organization_id = ?'];
  const params: unknown[] = [organizationId];
  if (q.after) {
    where.push('s.id < ?');
    params.push(q.after);
  }
  if (q.status) {
    where.push('s.status = ?');
    params.push(q.status);
  }
  if (q.tag !== undefined) {
    const [tagId] = await tagIdsByName(em, organizationId, [q.tag.trim()]);
    if (!tagId) return { items: [], hasMore: false };
    where.push('exists (select 1 from subscriber_tags st where st.subscriber_id = s.id and st.tag_id = ?)');
    params.push(tagId);
  }
  if (q.query) {
    const pattern = `%${q.query.replace(/[\\%_]/g, '\\$&')}%`;
    where.push(`(s.email like ? or s.name ilike ?)`);
    params.push(pattern.toLowerCase(), pattern);
  }
  const found = await rows<SubscriberRow>(
    em,
    `select s.* from subscribers s where ${where.join(' and ')} order by s.id desc limit ?`,
    [...params, q.limit + 1],
  );
  const hasMore = found.length > q.limit;
  const page = hasMore ? found.slice(0, q.limit) : found;
  const tags = await tagsOf(em, page.map((r) => r.id));
  return { items: page.map((r) => toRecord(r, tags.get(r.id) ?? [])), hasMore };
}

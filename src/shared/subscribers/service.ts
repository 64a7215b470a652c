import type { EntityManager } from '@mikro-orm/postgresql';
import type { SubscriberStatus } from '../db/entities/index.js';
import { assertOneCursor, pageOf } from '../db/cursor.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import type { QueueProducer } from '../queues/producer.js';
import { confirmationJob } from './confirmation.js';
import { cleanFields, cleanTagNames, normalizeEmail } from './input.js';
import { byName, toRecord, type SubscriberRecord, type SubscriberRow, type TagRef } from './rows.js';
import { nextStatus, UNSUBSCRIBABLE } from './states.js';
import { inTransaction, withConnection, type Db } from '../db/sql.js';
import * as q from './queries.js';
import type { WorkflowEvent } from './workflow-events.js';
import { recordContactChange } from '../webhooks/queries.js';

/**
 * Subscriber writes wait for the WAL flush like every other write: an acknowledged
 * subscriber must survive a PostgreSQL crash. `true` would trade the last fraction of a
 * second of acknowledged upserts for about twice the create throughput (docs/audience.md).
 */
const ASYNC_COMMIT = false;

/** What the audience functions need, passed explicitly (docs/architecture.md "Conventions"). */
export interface AudienceDeps {
  em: EntityManager;
  producer: QueueProducer;
  clock: () => Date;
}

/** Body of create and patch (docs/audience.md "Writes"), already validated. */
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
  /** Present only when some tag or field was not applied (docs/audience.md "Writes"). */
  warnings: string[];
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

/** `:subscriber` of a path: an id or an address (docs/audience.md). Optionally locks the row. */
export async function findSubscriberRow(em: Db, organizationId: string, ref: string, lock = false): Promise<SubscriberRow | null> {
  const byId = isId(ref, 'sub');
  return q.selectSubscriber(em, organizationId, byId ? 'id' : 'email', byId ? ref : normalizeEmail(ref), lock);
}

async function requireSubscriberRow(em: Db, organizationId: string, ref: string, lock = false): Promise<SubscriberRow> {
  const row = await findSubscriberRow(em, organizationId, ref, lock);
  if (!row) throw new NotFoundError(`No subscriber ${ref}`);
  return row;
}

export async function tagsOf(em: Db, subscriberIds: readonly string[]): Promise<Map<string, TagRef[]>> {
  const result = new Map<string, TagRef[]>(subscriberIds.map((id) => [id, []]));
  if (subscriberIds.length === 0) return result;
  const found = await q.selectTagsOf(em, subscriberIds);
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
  const select = () => q.selectTagsByName(em, organizationId, sorted);
  // Most writes name tags that exist: one read, and no insert at all.
  const found = await select();
  const have = new Set(found.map((t) => t.name.toLowerCase()));
  const missing = sorted.filter((name) => !have.has(name.toLowerCase()));
  if (missing.length === 0) return found;
  await q.insertMissingTags(
    em,
    organizationId,
    missing.map((name, ord) => ({ id: newId('tag'), name, ord })),
    now,
  );
  return select();
}

interface TagChanges {
  added: TagRef[];
  removed: TagRef[];
}

async function attachTags(em: Db, subscriberId: string, tags: readonly TagRef[], now: Date): Promise<TagRef[]> {
  if (tags.length === 0) return [];
  const ids = new Set(await q.insertSubscriberTags(em, subscriberId, tags.map((t) => t.id), now));
  return tags.filter((t) => ids.has(t.id));
}

function detachTags(em: Db, subscriberId: string, where: 'keep' | 'drop', tagIds: readonly string[]): Promise<TagRef[]> {
  return q.deleteSubscriberTags(em, subscriberId, where, tagIds);
}

async function tagIdsByName(em: Db, organizationId: string, names: readonly string[]): Promise<string[]> {
  if (names.length === 0) return [];
  return q.selectTagIdsByName(em, organizationId, names);
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
  owesConfirmation: boolean;
}

/**
 * Create-or-upsert, patch, tag changes and unsubscribe: one path, so every write applies
 * the same rules. Concurrent creates of one address are safe: the insert waits for a
 * concurrent insert of the same address, then the existing row is locked and updated, so
 * there is one row and no tag is lost.
 */
async function write(deps: AudienceDeps, organizationId: string, request: WriteRequest): Promise<WriteResult> {
  const { input, operation } = request;
  const tagInput = request.removeTags ? cleanTagNames(request.removeTags, { adding: false }) : cleanTagNames(input.tags);
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
      // The tags first, as an import makes them (import.ts): one lock order for every writer,
      // tags then subscribers, so a write and an import that both create a tag and touch the
      // same address never wait on each other in a cycle (a deadlock: one of them failed).
      const adding = !request.removeTags && input.tags !== undefined ? await ensureTags(tx, organizationId, tagInput.names, now) : undefined;

      if (operation === 'create') {
        row = await q.insertSubscriber(tx, {
          id: newId('sub'),
          email: newEmail,
          name: input.name ?? null,
          phone: input.phone ?? null,
          skipDoubleOptIn: input.skipDoubleOptIn === true,
          fields: JSON.stringify(fieldInput.set),
          signupIp: input.ipAddress ?? null,
          signupCountry: input.country ?? null,
          now,
          organizationId,
        });
        created = row !== undefined;
        if (row) {
          events.push({ name: 'subscriber.created', data: { status: row.status } });
          for (const [field, value] of Object.entries(fieldInput.set)) events.push({ name: 'subscriber.field_updated', data: { field, value } });
        }
      }

      let owesConfirmation = row?.status === 'PENDING_CONFIRMATION';
      if (!row) {
        const existing = await q.lockSubscriberForWrite(
          tx,
          organizationId,
          operation === 'create' || !isId(request.ref ?? '', 'sub') ? 'email' : 'id',
          operation === 'create' ? newEmail : isId(request.ref ?? '', 'sub') ? request.ref : normalizeEmail(request.ref ?? ''),
        );
        if (!existing) {
          if (operation === 'create') throw new Error('organization not found for a subscriber write');
          throw new NotFoundError(`No subscriber ${request.ref}`);
        }
        const updated = await updateExisting(tx, existing, request, fieldInput, newEmail, existing.double_opt_in, now, events);
        row = updated.row;
        owesConfirmation = updated.owesConfirmation;
      }

      // Tags after the status: a promotion (skipDoubleOptIn) is in place before tag events.
      const changes: TagChanges = { added: [], removed: [] };
      if (request.removeTags) {
        const ids = await tagIdsByName(tx, organizationId, tagInput.names);
        if (ids.length > 0) changes.removed = await detachTags(tx, row.id, 'drop', ids);
      } else if (adding) {
        // `replaceTags` without `tags` changes nothing: an omitted property never does (`tags: []` clears).
        changes.added = await attachTags(tx, row.id, adding, now);
        if (input.replaceTags === true) {
          changes.removed = await detachTags(tx, row.id, 'keep', adding.map((t) => t.id));
        }
      }
      for (const tag of changes.added.sort(byName)) events.push({ name: 'subscriber.tag_added', data: { tag } });
      for (const tag of changes.removed.sort(byName)) events.push({ name: 'subscriber.tag_removed', data: { tag } });
      if ((changes.added.length > 0 || changes.removed.length > 0) && new Date(row.updated_at).getTime() !== now.getTime()) {
        row = await q.touchSubscriber(tx, row.id, now);
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
      // The confirmation email is owed from this commit on, whatever happens to its job.
      if (owesConfirmation) await q.insertConfirmationDue(tx, row.id, now);
      return { row, tags, events: ordered, owesConfirmation };
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
): Promise<{ row: SubscriberRow; owesConfirmation: boolean }> {
  const { input, operation } = request;
  const sets: Array<{ column: q.SubscriberColumn; value: unknown; cast?: '::jsonb' }> = [];
  const set = (column: q.SubscriberColumn, value: unknown, cast?: '::jsonb') => {
    sets.push({ column, value, cast });
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
    if (await q.emailTaken(tx, existing.organization_id, newEmail)) {
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

  if (sets.length === 0) return { row: existing, owesConfirmation: false };
  set('updated_at', now);
  const updated = await q.updateSubscriber(tx, existing.id, sets);
  // A new confirmation is owed when the subscriber becomes pending, and when a pending one's
  // address changes: the link sent before signs the old address and confirms nothing now.
  const owesConfirmation = status === 'PENDING_CONFIRMATION' && (existing.status !== 'PENDING_CONFIRMATION' || changed.includes('email'));
  return { row: updated, owesConfirmation };
}

/**
 * Jobs of a committed write: the confirmation email, then the workflow events in order. A
 * confirmation whose job is lost here (Redis failed after the commit) is enqueued again by
 * the subscribers reconciler (workers/subscribers.ts), from the row written in the write's
 * transaction.
 */
async function afterCommit(deps: AudienceDeps, organizationId: string, outcome: Outcome, triggerWorkflows: boolean, now: Date): Promise<void> {
  if (outcome.owesConfirmation) {
    await deps.producer.add('subscribers', confirmationJob(outcome.row.id, now));
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
  /** The `limit` subscribers just newer than this id, still newest first. */
  before?: string;
  status?: SubscriberStatus;
  tag?: string;
  query?: string;
}

/** Newest first, keyset on the id (docs/audience.md "Lists"). */
export async function listSubscribers(
  em: EntityManager,
  organizationId: string,
  query: ListSubscribersQuery,
): Promise<{ items: SubscriberRecord[]; hasMore: boolean }> {
  return withConnection(em, (sql) => listOn(sql, organizationId, query));
}

async function listOn(em: Db, organizationId: string, query: ListSubscribersQuery): Promise<{ items: SubscriberRecord[]; hasMore: boolean }> {
  assertOneCursor(query);
  let tagId: string | undefined;
  if (query.tag !== undefined) {
    [tagId] = await tagIdsByName(em, organizationId, [query.tag.trim()]);
    if (!tagId) return { items: [], hasMore: false };
  }
  const pattern = query.query ? `%${query.query.replace(/[\\%_]/g, '\\$&')}%` : undefined;
  const found = await q.selectSubscriberPage(em, organizationId, { after: query.after, before: query.before, status: query.status, tagId, pattern }, query.limit + 1);
  const { items: page, hasMore } = pageOf(found, query.limit, query.before !== undefined);
  const tags = await tagsOf(em, page.map((r) => r.id));
  return { items: page.map((r) => toRecord(r, tags.get(r.id) ?? [])), hasMore };
}

import type { EntityManager } from '@mikro-orm/postgresql';
import type { SubscriberStatus } from '../db/entities/index.js';
import { rows, type Db } from '../db/sql.js';
import type { SubscriberRow, TagRef } from './rows.js';

/**
 * The data access of the audience: every statement on `subscribers`, `tags`,
 * `subscriber_tags`, `subscriber_events` and `subscriber_confirmations`. The write path
 * runs on a raw connection (`Db`, src/shared/db/sql.ts); the rest through `em.execute`.
 */

type Execute = Pick<EntityManager, 'execute'>;

/**
 * Arrays travel as one jsonb parameter (the SQL layer would spread a JS array into a list)
 * and are compared with `= any(array(select ...))`, which the planner turns into an index
 * lookup; `in (select ...)` would scan the whole table.
 */
function jsonArray(values: readonly string[]): string {
  return JSON.stringify(values);
}

// ---------------------------------------------------------------- subscribers

/** One subscriber of an organization by id or by (normalized) address; optionally locked. */
export async function selectSubscriber(db: Db, organizationId: string, by: 'id' | 'email', value: string, lock = false): Promise<SubscriberRow | null> {
  const found = await rows<SubscriberRow>(
    db,
    `select * from subscribers where organization_id = ? and ${by === 'id' ? 'id' : 'email'} = ?${lock ? ' for update' : ''}`,
    [organizationId, value],
  );
  return found[0] ?? null;
}

export interface NewSubscriber {
  id: string;
  email: string | undefined;
  name: string | null;
  phone: string | null;
  skipDoubleOptIn: boolean;
  /** Serialized JSON object. */
  fields: string;
  signupIp: string | null;
  signupCountry: string | null;
  now: Date;
  organizationId: string;
}

const INSERT_NEW = `
  insert into subscribers (id, organization_id, email, name, phone, status, fields, signup_ip, signup_country, created_at, updated_at)
  select ?, o.id, ?, ?, ?,
         case when o.double_opt_in and not ? then 'PENDING_CONFIRMATION' else 'SUBSCRIBED' end,
         ?::jsonb, ?, ?, ?, ?
    from organizations o where o.id = ?
  on conflict (organization_id, email) do nothing
  returning *`;

/** The new row, or undefined when the address exists (or the organization does not). */
export async function insertSubscriber(db: Db, s: NewSubscriber): Promise<SubscriberRow | undefined> {
  const inserted = await rows<SubscriberRow>(db, INSERT_NEW, [
    s.id,
    s.email,
    s.name,
    s.phone,
    s.skipDoubleOptIn,
    s.fields,
    s.signupIp,
    s.signupCountry,
    s.now,
    s.now,
    s.organizationId,
  ]);
  return inserted[0];
}

/** The subscriber to update, locked, with its organization's double opt-in setting. */
export async function lockSubscriberForWrite(
  db: Db,
  organizationId: string,
  by: 'id' | 'email',
  value: string | undefined,
): Promise<(SubscriberRow & { double_opt_in: boolean }) | undefined> {
  const found = await rows<SubscriberRow & { double_opt_in: boolean }>(
    db,
    `select s.*, o.double_opt_in from subscribers s join organizations o on o.id = s.organization_id
            where s.organization_id = ? and ${by === 'email' ? 's.email' : 's.id'} = ?
            for update of s`,
    [organizationId, value],
  );
  return found[0];
}

export async function touchSubscriber(db: Db, id: string, now: Date): Promise<SubscriberRow> {
  return (await rows<SubscriberRow>(db, 'update subscribers set updated_at = ? where id = ? returning *', [now, id]))[0]!;
}

export async function emailTaken(db: Db, organizationId: string, email: string): Promise<boolean> {
  const taken = await rows(db, 'select 1 from subscribers where organization_id = ? and email = ?', [organizationId, email]);
  return taken.length > 0;
}

export type SubscriberColumn = 'status' | 'unsubscribed_at' | 'email' | 'name' | 'phone' | 'signup_ip' | 'signup_country' | 'fields' | 'updated_at';

/** Sets these columns (in this order) of one subscriber; `cast` is a SQL cast of the value. */
export async function updateSubscriber(
  db: Db,
  id: string,
  changes: ReadonlyArray<{ column: SubscriberColumn; value: unknown; cast?: '' | '::jsonb' }>,
): Promise<SubscriberRow> {
  const sets = changes.map((c) => `${c.column} = ?${c.cast ?? ''}`);
  const params = changes.map((c) => c.value);
  const updated = await rows<SubscriberRow>(db, `update subscribers set ${sets.join(', ')} where id = ? returning *`, [...params, id]);
  return updated[0]!;
}

export interface SubscriberPageFilter {
  after?: string;
  /** Read upwards from this id (oldest first): the caller reverses the page. */
  before?: string;
  status?: SubscriberStatus;
  tagId?: string;
  /** A `like` pattern, already escaped. */
  pattern?: string;
}

/** Newest first (oldest first from `before`), keyset on the id: `limit` rows at most. */
export async function selectSubscriberPage(db: Db, organizationId: string, f: SubscriberPageFilter, limit: number): Promise<SubscriberRow[]> {
  const where = ['s.organization_id = ?'];
  const params: unknown[] = [organizationId];
  if (f.after) {
    where.push('s.id < ?');
    params.push(f.after);
  }
  if (f.before) {
    where.push('s.id > ?');
    params.push(f.before);
  }
  if (f.status) {
    where.push('s.status = ?');
    params.push(f.status);
  }
  if (f.tagId !== undefined) {
    where.push('exists (select 1 from subscriber_tags st where st.subscriber_id = s.id and st.tag_id = ?)');
    params.push(f.tagId);
  }
  if (f.pattern !== undefined) {
    where.push(`(s.email like ? or s.name ilike ?)`);
    params.push(f.pattern.toLowerCase(), f.pattern);
  }
  return rows<SubscriberRow>(db, `select s.* from subscribers s where ${where.join(' and ')} order by s.id ${f.before ? 'asc' : 'desc'} limit ?`, [...params, limit]);
}

// ---------------------------------------------------------------- tags of subscribers

export async function selectTagsOf(db: Db, subscriberIds: readonly string[]): Promise<Array<{ subscriber_id: string; id: string; name: string }>> {
  return rows<{ subscriber_id: string; id: string; name: string }>(
    db,
    `select st.subscriber_id, t.id, t.name from subscriber_tags st join tags t on t.id = st.tag_id
      where st.subscriber_id = any(array(select jsonb_array_elements_text(?::jsonb)))`,
    [jsonArray(subscriberIds)],
  );
}

/** The tags of these names (any case). */
export async function selectTagsByName(db: Db, organizationId: string, names: readonly string[]): Promise<TagRef[]> {
  return rows<TagRef>(
    db,
    `select id, name from tags where organization_id = ? and lower(name) = any(array(select lower(jsonb_array_elements_text(?::jsonb))))`,
    [organizationId, jsonArray(names)],
  );
}

/** Creates these tags, in `ord` order; a name that exists (any case) is skipped. */
export async function insertMissingTags(db: Db, organizationId: string, tags: ReadonlyArray<{ id: string; name: string; ord: number }>, now: Date): Promise<void> {
  await rows(
    db,
    `insert into tags (id, organization_id, name, created_at, updated_at)
     select n.id, ?, n.name, ?, ? from jsonb_to_recordset(?::jsonb) as n(id text, name text, ord int) order by n.ord
     on conflict (organization_id, lower(name)) do nothing`,
    [organizationId, now, now, JSON.stringify(tags)],
  );
}

/** The ids of the tags newly attached (those already attached are left out). */
export async function insertSubscriberTags(db: Db, subscriberId: string, tagIds: readonly string[], now: Date): Promise<string[]> {
  const inserted = await rows<{ tag_id: string }>(
    db,
    `insert into subscriber_tags (subscriber_id, tag_id, created_at)
     select ?, t, ? from jsonb_array_elements_text(?::jsonb) as t
     on conflict do nothing returning tag_id`,
    [subscriberId, now, jsonArray(tagIds)],
  );
  return inserted.map((r) => r.tag_id);
}

/** Detaches the tags listed (`drop`) or every tag but those (`keep`); the tags detached. */
export async function deleteSubscriberTags(db: Db, subscriberId: string, where: 'keep' | 'drop', tagIds: readonly string[]): Promise<TagRef[]> {
  return rows<TagRef>(
    db,
    `with gone as (
       delete from subscriber_tags where subscriber_id = ?
         and ${where === 'keep' ? 'not' : ''} (tag_id = any(array(select jsonb_array_elements_text(?::jsonb))))
       returning tag_id)
     select t.id, t.name from gone join tags t on t.id = gone.tag_id`,
    [subscriberId, jsonArray(tagIds)],
  );
}

export async function selectTagIdsByName(db: Db, organizationId: string, names: readonly string[]): Promise<string[]> {
  const found = await rows<{ id: string }>(
    db,
    `select id from tags where organization_id = ? and lower(name) = any(array(select lower(jsonb_array_elements_text(?::jsonb))))`,
    [organizationId, jsonArray(names)],
  );
  return found.map((r) => r.id);
}

// ---------------------------------------------------------------- tags

export async function selectTags(em: Execute, organizationId: string): Promise<TagRef[]> {
  return rows<TagRef>(em, 'select id, name from tags where organization_id = ? order by lower(name), id', [organizationId]);
}

export async function selectTagById(em: Execute, organizationId: string, id: string): Promise<TagRef | undefined> {
  return (await rows<TagRef>(em, 'select id, name from tags where organization_id = ? and id = ?', [organizationId, id]))[0];
}

export async function selectTagByName(em: Execute, organizationId: string, name: string): Promise<TagRef | undefined> {
  return (await rows<TagRef>(em, 'select id, name from tags where organization_id = ? and lower(name) = lower(?)', [organizationId, name]))[0];
}

/** The new tag, or undefined when the name is taken (any case). */
export async function insertTag(em: Execute, tag: { id: string; organizationId: string; name: string; now: Date }): Promise<TagRef | undefined> {
  const inserted = await rows<TagRef>(
    em,
    `insert into tags (id, organization_id, name, created_at, updated_at) values (?, ?, ?, ?, ?)
     on conflict (organization_id, lower(name)) do nothing returning id, name`,
    [tag.id, tag.organizationId, tag.name, tag.now, tag.now],
  );
  return inserted[0];
}

/**
 * Renames a tag; returns it with the name it had, read under the row lock of this update (a
 * concurrent rename has committed by then): what the campaigns' filters still name.
 */
export async function updateTagName(em: Execute, id: string, name: string, now: Date): Promise<(TagRef & { previous: string }) | undefined> {
  return (
    await rows<TagRef & { previous: string }>(
      em,
      `update tags t set name = ?, updated_at = ? from (select id, name from tags where id = ? for update) old
        where t.id = old.id returning t.id, t.name, old.name as previous`,
      [name, now, id],
    )
  )[0];
}

// ---------------------------------------------------------------- import

/** Upserts a batch of import rows (see import.ts for the rules); `inserted` tells new rows. */
export async function upsertImported(
  db: Db,
  organizationId: string,
  batch: ReadonlyArray<{ id: string; email: string; name: string | null; phone: string | null; fields: Record<string, string> }>,
  options: { resubscribe: boolean; now: Date },
): Promise<Array<{ id: string; email: string; inserted: boolean }>> {
  const { now } = options;
  return rows<{ id: string; email: string; inserted: boolean }>(
    db,
    `insert into subscribers (id, organization_id, email, name, phone, status, fields, created_at, updated_at)
       select r.id, ?, r.email, r.name, r.phone, 'SUBSCRIBED', r.fields, ?, ?
         from jsonb_to_recordset(?::jsonb) as r(id text, email text, name text, phone text, fields jsonb)
       on conflict (organization_id, email) do update set
         name = coalesce(excluded.name, subscribers.name),
         phone = coalesce(excluded.phone, subscribers.phone),
         fields = subscribers.fields || excluded.fields,
         status = case subscribers.status
           when 'UNSUBSCRIBED' then case when ? then 'SUBSCRIBED' else 'UNSUBSCRIBED' end
           when 'PENDING_CONFIRMATION' then 'SUBSCRIBED'
           when 'TRANSACTIONAL' then 'SUBSCRIBED'
           else subscribers.status end,
         unsubscribed_at = case when subscribers.status = 'UNSUBSCRIBED' and ? then null else subscribers.unsubscribed_at end,
         updated_at = excluded.updated_at
       returning id, email, (xmax = 0) as inserted`,
    [organizationId, now, now, JSON.stringify(batch), options.resubscribe, options.resubscribe],
  );
}

/** Attaches tags to subscribers: `s` a subscriber id, `t` a tag id. */
export async function insertTagPairs(db: Db, pairs: ReadonlyArray<{ s: string; t: string }>, now: Date): Promise<void> {
  await rows(
    db,
    `insert into subscriber_tags (subscriber_id, tag_id, created_at)
         select p.s, p.t, ? from jsonb_to_recordset(?::jsonb) as p(s text, t text)
         on conflict do nothing`,
    [now, JSON.stringify(pairs)],
  );
}

// ---------------------------------------------------------------- events

/** Revenue is integer cents that JSON and JavaScript read exactly: at most 2^53 - 1 either way. */
export const MAX_REVENUE = Number.MAX_SAFE_INTEGER;

/**
 * Moves the subscriber's revenue by `delta` and records the event in one statement; the
 * event id, or undefined when no such subscriber or when the revenue would leave
 * ±MAX_REVENUE (nothing is written then).
 */
export async function insertRevenueEvent(
  em: Execute,
  e: { id: string; organizationId: string; by: 'id' | 'email'; subscriber: string; delta: number; eventType: string; data: Record<string, unknown>; now: Date },
): Promise<string | undefined> {
  const inserted = (await em.execute(
    `with s as (
       update subscribers set revenue = revenue + ?, updated_at = ?
        where organization_id = ? and ${e.by === 'id' ? 'id' : 'email'} = ? and abs(revenue + ?) <= ${MAX_REVENUE}
       returning id)
     insert into subscriber_events (id, organization_id, subscriber_id, event_type, data, created_at)
     select ?, ?, s.id, ?, ?::jsonb, ? from s returning id`,
    [e.delta, e.now, e.organizationId, e.subscriber, e.delta, e.id, e.organizationId, e.eventType, JSON.stringify(e.data), e.now],
  )) as Array<{ id: string }>;
  return inserted[0]?.id;
}

export interface SubscriberEventRow {
  id: string;
  event_type: string;
  data: Record<string, unknown>;
  created_at: Date;
}

/** Newest first (oldest first from `before`: the caller reverses the page), keyset on the id. */
export async function selectSubscriberEvents(em: Execute, subscriberId: string, q: { after?: string; before?: string; limit: number }): Promise<SubscriberEventRow[]> {
  const params: unknown[] = [subscriberId];
  let cursor = '';
  if (q.after ?? q.before) {
    cursor = q.before ? ' and id > ?' : ' and id < ?';
    params.push(q.before ?? q.after);
  }
  return (await em.execute(
    `select id, event_type, data, created_at from subscriber_events where subscriber_id = ?${cursor} order by id ${q.before ? 'asc' : 'desc'} limit ?`,
    [...params, q.limit] as never[],
  )) as SubscriberEventRow[];
}

/** Idempotent by event id; false when it was recorded already or the subscriber is gone. */
export async function insertActivity(
  em: Execute,
  event: { id: string; organizationId: string; subscriberId: string; eventType: string; data: Record<string, unknown>; createdAt: Date },
): Promise<boolean> {
  const inserted = (await em.execute(
    `insert into subscriber_events (id, organization_id, subscriber_id, event_type, data, created_at)
     select ?, ?, s.id, ?, ?::jsonb, ? from subscribers s where s.id = ? and s.organization_id = ?
     on conflict (id) do nothing returning id`,
    [event.id, event.organizationId, event.eventType, JSON.stringify(event.data), event.createdAt, event.subscriberId, event.organizationId] as never[],
  )) as unknown[];
  return inserted.length > 0;
}

// ---------------------------------------------------------------- double opt-in

export async function selectConfirmationTarget(
  em: Execute,
  id: string,
  email: string,
): Promise<{ email: string; status: string; organization_name: string } | undefined> {
  const found = await em.execute<Array<{ email: string; status: string; organization_name: string }>>(
    `select s.email, s.status, o.name as organization_name from subscribers s join organizations o on o.id = s.organization_id
      where s.id = ? and s.email = ?`,
    [id, email],
  );
  return found[0];
}

export async function lockConfirmationTarget(em: Execute, id: string, email: string): Promise<(SubscriberRow & { organization_name: string }) | undefined> {
  const found = (await em.execute(
    `select s.*, o.name as organization_name from subscribers s join organizations o on o.id = s.organization_id
        where s.id = ? and s.email = ? for update of s`,
    [id, email],
  )) as Array<SubscriberRow & { organization_name: string }>;
  return found[0];
}

export async function markConfirmed(
  em: Execute,
  id: string,
  evidence: { now: Date; ip: string | null; userAgent: string | null },
): Promise<SubscriberRow | undefined> {
  const [confirmed] = (await em.execute(
    `update subscribers set status = 'SUBSCRIBED', confirmed_at = ?, confirm_ip = ?, confirm_user_agent = ?, updated_at = ? where id = ? returning *`,
    [evidence.now, evidence.ip, evidence.userAgent, evidence.now, id],
  )) as SubscriberRow[];
  return confirmed;
}

/**
 * The subscriber a `send-confirmation` job is about, with its organization's name and the time
 * of the confirmation it owes now (null when none is owed).
 */
export async function selectSubscriberWithOrganization(
  em: Execute,
  id: string,
): Promise<(SubscriberRow & { organization_name: string; owed_since: Date | null }) | undefined> {
  const found = (await em.execute(
    `select s.*, o.name as organization_name, c.created_at as owed_since
       from subscribers s join organizations o on o.id = s.organization_id
       left join subscriber_confirmations c on c.subscriber_id = s.id
      where s.id = ?`,
    [id],
  )) as Array<SubscriberRow & { organization_name: string; owed_since: Date | string | null }>;
  const row = found[0];
  return row && { ...row, owed_since: row.owed_since === null ? null : new Date(row.owed_since) };
}

/** The organization's senders, oldest first (the candidates for the confirmation's From). */
export async function selectSenderEmails(em: Execute, organizationId: string): Promise<string[]> {
  const senders = (await em.execute('select email from senders where organization_id = ? order by created_at, id limit 20', [organizationId])) as Array<{
    email: string;
  }>;
  return senders.map((s) => s.email);
}

// ---------------------------------------------------------------- confirmations owed

/**
 * Records, in the write's transaction, that this subscriber's confirmation email is owed
 * (the outbox of double opt-in: the job enqueued after the commit may be lost).
 */
export async function insertConfirmationDue(db: Db, subscriberId: string, now: Date): Promise<void> {
  await rows(
    db,
    `insert into subscriber_confirmations (subscriber_id, created_at) values (?, ?)
     on conflict (subscriber_id) do update set created_at = excluded.created_at`,
    [subscriberId, now],
  );
}

/** The confirmation is handed over (or no longer owed): forget a record made up to `upTo`. */
export async function deleteConfirmationDue(em: Execute, subscriberId: string, upTo: Date): Promise<void> {
  await em.execute('delete from subscriber_confirmations where subscriber_id = ? and created_at <= ?', [subscriberId, upTo], 'run');
}

/** Subscribers whose confirmation has been owed since before `before`, oldest first, with since when. */
export async function selectOverdueConfirmations(em: Execute, before: Date, limit: number): Promise<{ subscriberId: string; owedSince: Date }[]> {
  const found = await em.execute<Array<{ subscriber_id: string; created_at: Date }>>(
    'select subscriber_id, created_at from subscriber_confirmations where created_at < ? order by created_at limit ?',
    [before, limit],
    'all',
  );
  return found.map((r) => ({ subscriberId: r.subscriber_id, owedSince: new Date(r.created_at) }));
}

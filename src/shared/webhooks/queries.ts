import type { EntityManager } from '@mikro-orm/postgresql';
import { sqlOf, type Sql } from '../db/sql.js';
import type { SubscriberRecord } from '../subscribers/rows.js';
import { WEBHOOK_EVENT_TYPES, type WebhookEventType } from './events.js';

/**
 * The data access of webhooks: every statement on `webhook_endpoints` and
 * `webhook_messages`, the outbox's inserts (at the end of this file) included.
 */

export interface EndpointRow {
  id: string;
  organization_id: string;
  url: string;
  events: string[];
  description: string | null;
  enabled: boolean;
  disabled_reason: string | null;
  secret_sealed: string;
  failing_since: Date | null;
  created_at: Date;
  updated_at: Date;
}

export interface MessageRow {
  id: string;
  endpoint_id: string;
  type: string;
  status: 'pending' | 'succeeded' | 'failed';
  attempts: number;
  last_status_code: number | null;
  last_error: string | null;
  next_attempt_at: Date | null;
  created_at: Date;
}

type Db = Pick<EntityManager, 'execute'>;

// Every insert of messages locks the endpoints it writes for (the lock its foreign key check takes
// anyway, taken while reading them): an endpoint deleted at the same time is then skipped
// once the delete commits, where the check would fail the caller's whole transaction (a
// subscriber's write, a send's write-back) for an endpoint it never named.
const LOCK_ENDPOINTS = 'for key share of w';

// ---------------------------------------------------------------- endpoints

export async function insertEndpoint(
  em: Db,
  row: { id: string; organizationId: string; url: string; events: string[]; description: string | null; secretSealed: string },
): Promise<EndpointRow> {
  const [created] = await em.execute<EndpointRow[]>(
    `insert into webhook_endpoints (id, organization_id, url, events, description, secret_sealed)
     values (?, ?, ?, array(select jsonb_array_elements_text(?::jsonb)), ?, ?) returning *`,
    [row.id, row.organizationId, row.url, JSON.stringify(row.events), row.description, row.secretSealed],
    'all',
  );
  return created!;
}

export async function countEndpoints(em: Db, organizationId: string): Promise<number> {
  const [row] = await em.execute<{ n: number }[]>('select count(*)::int as n from webhook_endpoints where organization_id = ?', [organizationId], 'all');
  return row!.n;
}

export async function findEndpoint(em: Db, organizationId: string, id: string): Promise<EndpointRow | undefined> {
  const [row] = await em.execute<EndpointRow[]>('select * from webhook_endpoints where id = ? and organization_id = ?', [id, organizationId], 'all');
  return row;
}

export async function listEndpoints(em: Db, organizationId: string, options: { limit: number; after?: string }): Promise<EndpointRow[]> {
  return em.execute<EndpointRow[]>(
    `select * from webhook_endpoints where organization_id = ? and (?::text is null or id < ?) order by id desc limit ?`,
    [organizationId, options.after ?? null, options.after ?? null, options.limit],
    'all',
  );
}

export async function updateEndpoint(
  em: Db,
  organizationId: string,
  id: string,
  patch: { url?: string; events?: string[]; description?: string | null; enabled?: boolean; secretSealed?: string },
): Promise<EndpointRow | undefined> {
  const sets: string[] = [];
  const params: unknown[] = [];
  if (patch.url !== undefined) {
    sets.push('url = ?');
    params.push(patch.url);
  }
  if (patch.events !== undefined) {
    sets.push('events = array(select jsonb_array_elements_text(?::jsonb))');
    params.push(JSON.stringify(patch.events));
  }
  if (patch.description !== undefined) {
    sets.push('description = ?');
    params.push(patch.description);
  }
  if (patch.secretSealed !== undefined) {
    sets.push('secret_sealed = ?');
    params.push(patch.secretSealed);
  }
  if (patch.enabled !== undefined) {
    // Enabling again starts afresh: no reason, and the 5 days of failures count from zero.
    sets.push('enabled = ?');
    params.push(patch.enabled);
    if (patch.enabled) sets.push('disabled_reason = null, failing_since = null');
    else sets.push(`disabled_reason = 'disabled by the user'`);
  }
  sets.push('updated_at = now()');
  const [row] = await em.execute<EndpointRow[]>(
    `update webhook_endpoints set ${sets.join(', ')} where id = ? and organization_id = ? returning *`,
    [...params, id, organizationId],
    'all',
  );
  return row;
}

export async function deleteEndpoint(em: Db, organizationId: string, id: string): Promise<boolean> {
  const rows = await em.execute<{ id: string }[]>('delete from webhook_endpoints where id = ? and organization_id = ? returning id', [id, organizationId], 'all');
  return rows.length > 0;
}

// ---------------------------------------------------------------- deliveries (the API)

export async function listMessages(em: Db, endpointId: string, options: { limit: number; after?: string; before?: string }): Promise<MessageRow[]> {
  const columns = 'id, endpoint_id, type, status, attempts, last_status_code, last_error, next_attempt_at, created_at';
  if (options.before !== undefined) {
    // The `limit` items just newer than the cursor, still newest first
    // (docs/foundation.md "Identifiers, time and lists").
    const rows = await em.execute<MessageRow[]>(
      `select ${columns} from webhook_messages where endpoint_id = ? and id > ? order by id asc limit ?`,
      [endpointId, options.before, options.limit],
      'all',
    );
    return rows.reverse();
  }
  return em.execute<MessageRow[]>(
    `select ${columns} from webhook_messages where endpoint_id = ? and (?::text is null or id < ?) order by id desc limit ?`,
    [endpointId, options.after ?? null, options.after ?? null, options.limit],
    'all',
  );
}

/** Whether `messageId` is a delivery of the endpoint (a list cursor must be one). */
export async function hasMessage(em: Db, endpointId: string, messageId: string): Promise<boolean> {
  const rows = await em.execute<{ id: string }[]>('select id from webhook_messages where id = ? and endpoint_id = ?', [messageId, endpointId], 'all');
  return rows.length > 0;
}

/** `POST …/deliveries/{msgId}/retry`: due now, whatever its state; its attempts keep counting. */
export async function retryMessage(em: Db, endpointId: string, messageId: string): Promise<MessageRow | undefined> {
  const [row] = await em.execute<MessageRow[]>(
    `update webhook_messages set status = 'pending', next_attempt_at = now(), locked_until = null, updated_at = now()
     where id = ? and endpoint_id = ? returning *`,
    [messageId, endpointId],
    'all',
  );
  return row;
}

/**
 * `POST …/test`: a `webhook.test` message for this endpoint alone; nothing when the endpoint
 * is gone (deleted meanwhile: the lock waits for the delete, then finds no row).
 */
export async function insertTestMessage(em: Db, endpointId: string, id: string, payload: unknown): Promise<MessageRow | undefined> {
  const [row] = await em.execute<MessageRow[]>(
    `insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
     select ?, w.id, w.organization_id, 'webhook.test', ?::jsonb, now() from webhook_endpoints w where w.id = ?
     ${LOCK_ENDPOINTS} returning *`,
    [id, JSON.stringify(payload), endpointId],
    'all',
  );
  return row;
}

// ---------------------------------------------------------------- the worker

/** Enabled endpoints that have a message due and not claimed (the dispatcher's scan). */
export async function endpointsWithDueMessages(em: Db, limit: number): Promise<string[]> {
  const rows = await em.execute<{ id: string }[]>(
    `select w.id from webhook_endpoints w
     where w.enabled and exists (
       select 1 from webhook_messages m
       where m.endpoint_id = w.id and m.status = 'pending' and m.next_attempt_at <= now()
         and (m.locked_until is null or m.locked_until < now()))
     limit ?`,
    [limit],
    'all',
  );
  return rows.map((r) => r.id);
}

export interface ClaimedMessage {
  id: string;
  type: string;
  payload: unknown;
  attempts: number;
}

/**
 * Claims up to `limit` due messages of one endpoint for `leaseMs`, oldest first. SKIP LOCKED
 * and the lease let several workers share an endpoint's backlog without taking a message
 * twice; a claimer that dies leaves its rows to be claimed again once the lease ends.
 */
export async function claimMessages(em: Db, endpointId: string, limit: number, leaseMs: number): Promise<ClaimedMessage[]> {
  // RETURNING keeps no order: the claimed rows are sorted again, so they are posted oldest first.
  return em.execute<ClaimedMessage[]>(
    `with claimed as (
       update webhook_messages m set locked_until = now() + (? * interval '1 millisecond')
       where m.id in (
         select id from webhook_messages
         where endpoint_id = ? and status = 'pending' and next_attempt_at <= now() and (locked_until is null or locked_until < now())
         order by next_attempt_at, id limit ? for update skip locked)
       returning m.id, m.type, m.payload, m.attempts, m.next_attempt_at)
     select id, type, payload, attempts from claimed order by next_attempt_at, id`,
    [leaseMs, endpointId, limit],
    'all',
  );
}

export interface AttemptResult {
  id: string;
  status: 'pending' | 'succeeded' | 'failed';
  code: number | null;
  error: string | null;
  /** When pending: the next attempt. */
  next: string | null;
}

/** The outcomes of a batch of attempts, in one statement. */
export async function recordAttempts(em: Db, results: AttemptResult[]): Promise<void> {
  if (results.length === 0) return;
  await em.execute(
    `update webhook_messages m set status = v.status, attempts = m.attempts + 1, last_status_code = v.code, last_error = v.error,
       next_attempt_at = v.next, locked_until = null, updated_at = now()
     from jsonb_to_recordset(?::jsonb) as v(id text, status text, code int, error text, next timestamptz)
     where m.id = v.id`,
    [JSON.stringify(results)],
    'run',
  );
}

/** Claimed messages given back unattempted (their endpoint was disabled meanwhile). */
export async function releaseMessages(em: Db, ids: readonly string[]): Promise<void> {
  await em.execute(`update webhook_messages set locked_until = null where id in (select jsonb_array_elements_text(?::jsonb))`, [JSON.stringify(ids)], 'run');
}

/**
 * The endpoint's health after a batch: any success clears its failing streak; a batch that
 * all failed starts one, and a streak older than `disableAfterMs` disables the endpoint.
 * Returns true when this call disabled it.
 */
export async function recordEndpointHealth(em: Db, endpointId: string, anySuccess: boolean, disableAfterMs: number, reason: string): Promise<boolean> {
  if (anySuccess) {
    await em.execute('update webhook_endpoints set failing_since = null where id = ? and failing_since is not null', [endpointId], 'run');
    return false;
  }
  const rows = await em.execute<{ enabled: boolean }[]>(
    `update webhook_endpoints set failing_since = coalesce(failing_since, now()),
       enabled = case when failing_since < now() - (? * interval '1 millisecond') then false else enabled end,
       disabled_reason = case when enabled and failing_since < now() - (? * interval '1 millisecond') then ? else disabled_reason end,
       updated_at = now()
     where id = ? and enabled returning enabled`,
    [disableAfterMs, disableAfterMs, reason, endpointId],
    'all',
  );
  return rows[0]?.enabled === false;
}

export async function loadEndpointForDelivery(em: Db, endpointId: string): Promise<Pick<EndpointRow, 'id' | 'url' | 'enabled' | 'secret_sealed'> | undefined> {
  const [row] = await em.execute<EndpointRow[]>('select id, url, enabled, secret_sealed from webhook_endpoints where id = ?', [endpointId], 'all');
  return row;
}

// ---------------------------------------------------------------------------------------
// The outbox.

/**
 * The transactional outbox (docs/webhooks.md "How it works"): every event is written as one
 * `webhook_messages` row per enabled endpoint of the organization subscribed to its type, by the
 * statement of the caller's transaction, so the event commits or rolls back with the change it
 * reports. A row per endpoint (not one per event) gives each endpoint its own delivery state and
 * retries; its id is the `webhook-id` header. Nothing here talks to Redis: the dispatcher
 * (dispatcher.ts) finds the rows.
 *
 * Every function takes whatever the caller's transaction runs on: a connection of the raw-SQL
 * helper (`Sql`, db/sql.ts) or a MikroORM EntityManager (its transaction, when it has one).
 */
export type OutboxDb = Sql | EntityManager;

/**
 * `name` prepares the statement once per connection (db/sql.ts). The outbox inserts are
 * built of large expressions: planned anew, `INSERT_SENT` cost PostgreSQL four times its own
 * execution, in every write-back of the send path (bench/README.md, 2026-12-07).
 */
async function run(db: OutboxDb, text: string, values: unknown[], name: string): Promise<void> {
  await ('query' in db ? db : sqlOf(db)).query(text, values, name);
}

export interface OutboxEvent {
  organizationId: string;
  type: WebhookEventType;
  data: Record<string, unknown>;
}

// The body's `created_at` is the time of the change (the transaction's time), with
// milliseconds in UTC as every timestamp of the API
// (docs/foundation.md "Identifiers, time and lists").
const NOW_ISO = `to_char(now() at time zone 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
const ISO = (column: string) => `to_char(${column} at time zone 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
const SUBSCRIBED = (type: string) => `w.enabled and w.events && array[${type}, '*']::text[]`;

const INSERT_ONE = `
  insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
  select webhook_message_id(), w.id, w.organization_id, ?::text,
    jsonb_build_object('type', ?::text, 'created_at', ${NOW_ISO}, 'data', ?::jsonb), now()
  from webhook_endpoints w where w.organization_id = ? and ${SUBSCRIBED('?::text')}
  ${LOCK_ENDPOINTS}`;

/**
 * Records one event for every enabled endpoint of the organization subscribed to its type,
 * in the caller's transaction. One statement; nothing is written when no endpoint wants it.
 */
export async function recordEvent(db: OutboxDb, event: OutboxEvent): Promise<void> {
  if (!WEBHOOK_EVENT_TYPES.includes(event.type)) throw new Error(`unknown webhook event type ${event.type}`);
  await run(db, INSERT_ONE, [event.type, event.type, JSON.stringify(event.data), event.organizationId, event.type], 'mailroom_outbox_event');
}

/** Per email, the parts of `data` that only its caller knows (`bounce`, `click`). */
export interface EmailEventItem {
  emailId: string;
  extra?: Record<string, unknown>;
}

// The `data` of every email event (docs/webhooks.md "What is posted"), built from the email's row
// by the same statement that writes the outbox rows, so a batch of emails costs one statement.
const EMAIL_DATA = `jsonb_build_object(
    'email_id', e.id, 'message_id', e.message_id, 'from', e.from_address, 'to', jsonb_build_array(e.to_address),
    'subject', e.subject, 'tags', e.tags, 'created_at', ${ISO('e.created_at')})
  || case when e.campaign_id is null then '{}'::jsonb else jsonb_build_object('campaign_id', e.campaign_id) end
  || case when e.status = 'failed' then jsonb_build_object('reason', e.failure_reason) else '{}'::jsonb end`;

/** The columns of `emails` that EMAIL_DATA and emailEventsInsert read: what a caller's RETURNING gives emailEventsFrom. */
export const emailEventColumns = (alias: string) =>
  ['id', 'status', 'failure_reason', 'organization_id', 'message_id', 'from_address', 'to_address', 'subject', 'tags', 'created_at', 'campaign_id'].map((c) => `${alias}.${c}`).join(', ');

/**
 * The outbox insert of email events: one row for each email of `source` (a FROM clause that
 * names the emails `e`) and each enabled endpoint subscribed to `type` (an SQL expression),
 * `extra` added to `data`, the emails filtered by `where` (a WHERE clause, or nothing).
 */
const emailEventsInsert = (source: string, type: string, extra = '', where = '') => `
  insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
  select webhook_message_id(), w.id, e.organization_id, ${type},
    jsonb_build_object('type', ${type}, 'created_at', ${NOW_ISO}, 'data', ${EMAIL_DATA}${extra}), now()
  ${source}
  join webhook_endpoints w on w.organization_id = e.organization_id and ${SUBSCRIBED(type)}
  ${where}
  ${LOCK_ENDPOINTS}`;

// Bound: the type (three times) and the emails with their `extra`, as jsonb.
const INSERT_EMAILS = emailEventsInsert(`from jsonb_to_recordset(?::jsonb) as v(id text, extra jsonb) join emails e on e.id = v.id`, '?::text', ` || coalesce(v.extra, '{}'::jsonb)`);

/**
 * The outbox rows of one email event for the rows of `relation`, a data-modifying WITH of
 * the caller's statement: `relation` is one of its own CTEs that returns the emails' columns
 * as they now are (an UPDATE's RETURNING of emailEventColumns), read here as `e`. The event
 * then commits with the change itself, with nothing to lose in between.
 */
export function emailEventsFrom(relation: string, type: WebhookEventType): string {
  if (!WEBHOOK_EVENT_TYPES.includes(type)) throw new Error(`unknown webhook event type ${type}`);
  return emailEventsInsert(`from ${relation} e`, `'${type}'::text`);
}

/** Records one email event per email (set-based: one statement for the whole batch). */
export async function recordEmailEvents(db: OutboxDb, type: WebhookEventType, items: readonly EmailEventItem[]): Promise<void> {
  if (items.length === 0) return;
  const rows = items.map((i) => ({ id: i.emailId, extra: i.extra ?? null }));
  await run(db, INSERT_EMAILS, [type, type, JSON.stringify(rows), type], 'mailroom_outbox_emails');
}

// Rows the send path's write-back just set (its `sent_at = now()` is this transaction's
// time, stored to the millisecond, which no earlier write can have): `email.sent`, and `email.delivered` too when the
// transport reported delivery at once (the file transport).
const INSERT_SENT = emailEventsInsert(
  `from emails e cross join lateral (select 'email.sent'::text as type union all select 'email.delivered' where e.delivery_status = 'delivered') t`,
  't.type',
  '',
  `where e.id = any(array(select jsonb_array_elements_text(?::jsonb))) and e.status = 'sent' and e.sent_at = now()::timestamptz(3)`,
);

/**
 * `email.sent` (and `email.delivered`) for the emails of one group-committed write-back,
 * in its transaction, after its update.
 */
export async function recordSentEmails(db: OutboxDb, emailIds: readonly string[]): Promise<void> {
  if (emailIds.length === 0) return;
  await run(db, INSERT_SENT, [JSON.stringify(emailIds)], 'mailroom_outbox_sent');
}

type ContactEventType = 'contact.created' | 'contact.updated' | 'contact.unsubscribed';

/** `data` of a contact event: the subscriber's create/patch shape. */
function contactData(subscriber: SubscriberRecord): Record<string, unknown> {
  const { id, email, name, phone, status, tags, fields } = subscriber;
  return { id, email, name, phone, status, tags, fields };
}

/** `contact.created` / `contact.updated` / `contact.unsubscribed` of one subscriber write. */
export async function recordContactEvent(db: OutboxDb, type: ContactEventType, subscriber: SubscriberRecord): Promise<void> {
  await recordEvent(db, { organizationId: subscriber.organizationId, type, data: contactData(subscriber) });
}

// Bound: the type (three times) and the organizations with their `data`, as jsonb.
const INSERT_CONTACTS = `
  insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
  select webhook_message_id(), w.id, w.organization_id, ?::text,
    jsonb_build_object('type', ?::text, 'created_at', ${NOW_ISO}, 'data', v.data), now()
  from jsonb_to_recordset(?::jsonb) as v(organization_id text, data jsonb)
  join webhook_endpoints w on w.organization_id = v.organization_id and ${SUBSCRIBED('?::text')}
  ${LOCK_ENDPOINTS}`;

/** One contact event for each of many subscribers (the delivery-feedback recorder's batches): one statement. */
export async function recordContactEvents(db: OutboxDb, type: ContactEventType, subscribers: readonly SubscriberRecord[]): Promise<void> {
  if (subscribers.length === 0) return;
  const rows = subscribers.map((s) => ({ organization_id: s.organizationId, data: contactData(s) }));
  await run(db, INSERT_CONTACTS, [type, type, JSON.stringify(rows), type], 'mailroom_outbox_contacts');
}

/**
 * The contact event of one committed subscriber write: `contact.created` for a new row,
 * `contact.unsubscribed` when it became UNSUBSCRIBED, else `contact.updated` when anything
 * changed (`changes` are the write's change events; none: no event).
 */
export async function recordContactChange(
  db: OutboxDb,
  write: { created: boolean; changes: readonly { name: string }[]; subscriber: SubscriberRecord },
): Promise<void> {
  if (!write.created && write.changes.length === 0) return;
  const type = write.created ? 'contact.created' : write.changes.some((c) => c.name === 'subscriber.unsubscribed') ? 'contact.unsubscribed' : 'contact.updated';
  await recordContactEvent(db, type, write.subscriber);
}

/**
 * `email.opened` / `email.clicked` for the emails whose first open / first click a batch of
 * tracking hits just set (once per email, like the unique counts); a click carries the URL
 * of the email's earliest click in the batch.
 */
export async function recordTrackingEvents(
  db: OutboxDb,
  opened: readonly { id: string }[],
  clicked: readonly { id: string }[],
  hits: readonly { emailId: string; type: 'open' | 'click'; at: Date; url: string | null }[],
): Promise<void> {
  await recordEmailEvents(db, 'email.opened', opened.map((r) => ({ emailId: r.id })));
  if (clicked.length === 0) return;
  const firstUrl = new Map<string, { at: Date; url: string | null }>();
  for (const hit of hits) {
    if (hit.type !== 'click') continue;
    const seen = firstUrl.get(hit.emailId);
    if (!seen || hit.at < seen.at) firstUrl.set(hit.emailId, { at: hit.at, url: hit.url });
  }
  await recordEmailEvents(db, 'email.clicked', clicked.map((r) => ({ emailId: r.id, extra: { click: { url: firstUrl.get(r.id)?.url ?? null } } })));
}

const INSERT_CAMPAIGN = `
  insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
  select webhook_message_id(), w.id, c.organization_id, 'campaign.sent',
    jsonb_build_object('type', 'campaign.sent', 'created_at', ${NOW_ISO}, 'data', jsonb_build_object(
      'campaign_id', c.id, 'name', c.name, 'subject', c.subject, 'recipient_count', c.recipient_count,
      'emails_sent_count', c.emails_sent_count, 'finished_at', ${ISO('c.finished_at')})), now()
  from campaigns c join webhook_endpoints w on w.organization_id = c.organization_id and ${SUBSCRIBED(`'campaign.sent'`)}
  where c.id = ?
  ${LOCK_ENDPOINTS}`;

/** `campaign.sent`, in the transaction that moves the campaign to SENT. */
export async function recordCampaignSent(db: OutboxDb, campaignId: string): Promise<void> {
  await run(db, INSERT_CAMPAIGN, [campaignId], 'mailroom_outbox_campaign');
}

/** `domain.verified` / `domain.failed` for a domain whose status just became VERIFIED / FAILED. */
export async function recordDomainStatus(
  db: OutboxDb,
  domain: { id: string; organizationId: string; domain: string; status: string; message?: string | null },
  previousStatus: string,
): Promise<void> {
  if (domain.status === previousStatus || (domain.status !== 'VERIFIED' && domain.status !== 'FAILED')) return;
  await recordEvent(db, {
    organizationId: domain.organizationId,
    type: domain.status === 'VERIFIED' ? 'domain.verified' : 'domain.failed',
    data: { id: domain.id, domain: domain.domain, status: domain.status, message: domain.message ?? null },
  });
}

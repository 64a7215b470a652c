import type { SubscriberRecord } from '../subscribers/rows.js';
import { WEBHOOK_EVENT_TYPES, type WebhookEventType } from './events.js';

/**
 * The transactional outbox (contract 17): every event is written as one `webhook_messages`
 * row per enabled endpoint of the organization subscribed to its type, by the statement of
 * the caller's transaction, so the event commits or rolls back with the change it reports.
 * A row per endpoint (not one per event) gives each endpoint its own delivery state and
 * retries; its id is the `webhook-id` header. Nothing here talks to Redis: the dispatcher
 * (dispatcher.ts) finds the rows.
 *
 * Every function takes whatever the caller's transaction runs on: a raw connection of the
 * audience path (`query`), a MikroORM EntityManager (`execute`) or a knex transaction (`raw`).
 */
export type OutboxDb =
  | { query(text: string, values?: readonly unknown[]): Promise<unknown[]> }
  | { execute(text: string, values?: unknown[], method?: 'all' | 'run' | 'get'): Promise<unknown> }
  | { raw(text: string, values: readonly unknown[]): PromiseLike<unknown> };

async function run(db: OutboxDb, text: string, values: unknown[]): Promise<void> {
  if ('query' in db) await db.query(text, values);
  else if ('execute' in db) await db.execute(text, values, 'run');
  else await db.raw(text, values as never[]);
}

export interface OutboxEvent {
  organizationId: string;
  type: WebhookEventType;
  data: Record<string, unknown>;
}

// The body's `created_at` is the time of the change (the transaction's time), with
// milliseconds in UTC as every timestamp of the API (contract 3).
const NOW_ISO = `to_char(now() at time zone 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
const ISO = (column: string) => `to_char(${column} at time zone 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;
const SUBSCRIBED = (type: string) => `w.enabled and w.events && array[${type}, '*']::text[]`;

const INSERT_ONE = `
  insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
  select webhook_message_id(), w.id, w.organization_id, ?::text,
    jsonb_build_object('type', ?::text, 'created_at', ${NOW_ISO}, 'data', ?::jsonb), now()
  from webhook_endpoints w where w.organization_id = ? and ${SUBSCRIBED('?::text')}`;

/**
 * Records one event for every enabled endpoint of the organization subscribed to its type,
 * in the caller's transaction. One statement; nothing is written when no endpoint wants it.
 */
export async function recordEvent(db: OutboxDb, event: OutboxEvent): Promise<void> {
  if (!WEBHOOK_EVENT_TYPES.includes(event.type)) throw new Error(`unknown webhook event type ${event.type}`);
  await run(db, INSERT_ONE, [event.type, event.type, JSON.stringify(event.data), event.organizationId, event.type]);
}

/** Per email, the parts of `data` that only its caller knows (`bounce`, `click`). */
export interface EmailEventItem {
  emailId: string;
  extra?: Record<string, unknown>;
}

// The `data` of every email event (contract 17), built from the email's row by the same
// statement that writes the outbox rows, so a batch of emails costs one statement.
const EMAIL_DATA = `jsonb_build_object(
    'email_id', e.id, 'message_id', e.message_id, 'from', e.from_address, 'to', jsonb_build_array(e.to_address),
    'subject', e.subject, 'tags', e.tags, 'created_at', ${ISO('e.created_at')})
  || case when e.campaign_id is null then '{}'::jsonb else jsonb_build_object('campaign_id', e.campaign_id) end
  || case when e.status = 'failed' then jsonb_build_object('reason', e.failure_reason) else '{}'::jsonb end`;

const INSERT_EMAILS = `
  insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
  select webhook_message_id(), w.id, e.organization_id, ?::text,
    jsonb_build_object('type', ?::text, 'created_at', ${NOW_ISO}, 'data', ${EMAIL_DATA} || coalesce(v.extra, '{}'::jsonb)), now()
  from jsonb_to_recordset(?::jsonb) as v(id text, extra jsonb)
  join emails e on e.id = v.id
  join webhook_endpoints w on w.organization_id = e.organization_id and ${SUBSCRIBED('?::text')}`;

/** Records one email event per email (set-based: one statement for the whole batch). */
export async function recordEmailEvents(db: OutboxDb, type: WebhookEventType, items: readonly EmailEventItem[]): Promise<void> {
  if (items.length === 0) return;
  const rows = items.map((i) => ({ id: i.emailId, extra: i.extra ?? null }));
  await run(db, INSERT_EMAILS, [type, type, JSON.stringify(rows), type]);
}

// Rows the send path's write-back just set (its `sent_at = now()` is this transaction's
// time, stored to the millisecond, which no earlier write can have): `email.sent`, and `email.delivered` too when the
// transport reported delivery at once (the file transport).
const INSERT_SENT = `
  insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
  select webhook_message_id(), w.id, e.organization_id, t.type,
    jsonb_build_object('type', t.type, 'created_at', ${NOW_ISO}, 'data', ${EMAIL_DATA}), now()
  from emails e
  cross join lateral (select 'email.sent'::text as type union all select 'email.delivered' where e.delivery_status = 'delivered') t
  join webhook_endpoints w on w.organization_id = e.organization_id and ${SUBSCRIBED('t.type')}
  where e.id = any(array(select jsonb_array_elements_text(?::jsonb))) and e.status = 'sent' and e.sent_at = now()::timestamptz(3)`;

/**
 * `email.sent` (and `email.delivered`) for the emails of one group-committed write-back,
 * in its transaction, after its update.
 */
export async function recordSentEmails(db: OutboxDb, emailIds: readonly string[]): Promise<void> {
  if (emailIds.length === 0) return;
  await run(db, INSERT_SENT, [JSON.stringify(emailIds)]);
}

/** `contact.created` / `contact.updated` / `contact.unsubscribed`: `data` is the create/patch shape. */
export async function recordContactEvent(
  db: OutboxDb,
  type: 'contact.created' | 'contact.updated' | 'contact.unsubscribed',
  subscriber: SubscriberRecord,
): Promise<void> {
  const { id, email, name, phone, status, tags, fields } = subscriber;
  await recordEvent(db, { organizationId: subscriber.organizationId, type, data: { id, email, name, phone, status, tags, fields } });
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
  where c.id = ?`;

/** `campaign.sent`, in the transaction that moves the campaign to SENT. */
export async function recordCampaignSent(db: OutboxDb, campaignId: string): Promise<void> {
  await run(db, INSERT_CAMPAIGN, [campaignId]);
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

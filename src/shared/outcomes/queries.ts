import type { EntityManager } from '@mikro-orm/postgresql';
import { sqlOf, withConnection } from '../db/sql.js';
import { unstorable } from '../storable.js';
import type { SubscriberRow } from '../subscribers/rows.js';

/**
 * The data access of outcomes: every statement of the tracking recorder (recorder.ts), the
 * delivery-feedback recorder (provider-events.ts) and the campaign counters (campaigns.ts).
 * Typed rows in and out; the statements of one batch are set-based (one statement a table
 * whatever the batch size).
 */

/**
 * Bound parameters, inside the caller's transaction when it has one (db/sql.ts). `name`
 * prepares the statement once per connection: the batch statements of the feedback recorder,
 * planned anew for every batch, cost PostgreSQL a tenth more than running them.
 */
function query<T>(em: EntityManager, sql: string, params: unknown[], name?: string): Promise<T[]> {
  return sqlOf(em).query<T>(sql, params, name);
}

// ---------------------------------------------------------------- tracking (recorder.ts)

/**
 * The events of a batch in one INSERT ... SELECT FROM unnest(arrays): one bound parameter a
 * column whatever the batch size (cheaper for PostgreSQL to read than a JSON document, and
 * the statement text never changes, so it is prepared once per connection). Joined to
 * `emails`, which supplies the organization: a hit of an unknown email is not recorded.
 */
// The emails are locked (FOR KEY SHARE) while their events are written: email_events has no
// foreign key, and an email deleted at the same moment (the retention purge, whose trigger
// deletes its events in the same statement) would otherwise keep the events of this insert
// for good. Now the purge waits for the insert and its trigger takes them, or the insert
// waits for the purge and finds the email gone.
const INSERT_EVENTS = `insert into email_events (email_id, organization_id, type, occurred_at, ip, user_agent, url)
  select h.email_id, e.organization_id, h.type, h.at, h.ip, h.ua, h.url
  from unnest(?::text[], ?::text[], ?::timestamptz[], ?::text[], ?::text[], ?::text[]) as h(email_id, type, at, ip, ua, url)
  join emails e on e.id = h.email_id
  for key share of e`;

/** The columns of INSERT_EVENTS: email ids, types, ISO times, ips, user agents, urls. */
export type TrackingEventColumns = [string[], string[], string[], (string | null)[], (string | null)[], (string | null)[]];

/** Tracking events alone, one prepared statement on a pooled connection (its own implicit transaction). */
export async function insertTrackingEventsOnce(em: EntityManager, columns: TrackingEventColumns): Promise<void> {
  await withConnection(em, (sql) => sql.query(INSERT_EVENTS, columns, 'mailroom_insert_email_events'));
}

/** Tracking events in the caller's transaction. */
export async function insertTrackingEvents(em: EntityManager, columns: TrackingEventColumns): Promise<void> {
  await query(em, INSERT_EVENTS, columns);
}

/** An email whose first open or click a batch just set. */
export interface FirstEngagement {
  id: string;
  /** The campaign whose counters it moves: a campaign email's, not a test send's (source `test`). */
  campaign_id: string | null;
  /**
   * The bare `to` address this engagement proves a mailbox for (docs/security.md), or null: only an
   * email handed over to its one recipient (no cc, no bcc: no other copy carries its pixel and
   * links, a bcc to oneself included) and not bounced.
   */
  proves: string | null;
  /** When (the hit's time written as the first open or click). */
  at: Date;
}

/**
 * Sets `first_opened_at` / `first_clicked_at` of the emails that have none yet (the `is null`
 * condition under the row lock makes concurrent batches set each email once); returns them.
 */
export async function setFirstEngagement(em: EntityManager, kind: 'open' | 'click', candidates: { id: string; at: string }[]): Promise<FirstEngagement[]> {
  const column = kind === 'open' ? 'first_opened_at' : 'first_clicked_at';
  return query<FirstEngagement>(
    em,
    `update emails e set ${column} = f.at, updated_at = now()
     from jsonb_to_recordset(?::jsonb) as f(id text, at timestamptz)
     where e.id = f.id and e.${column} is null
     returning e.id, case when e.source = 'campaign' then e.campaign_id end as campaign_id,
       case when e.status = 'sent' and e.delivery_status is distinct from 'bounced'
         and (e.cc is null or e.cc = '[]'::jsonb) and (e.bcc is null or e.bcc = '[]'::jsonb)
         then email_bare_address(e.to_address) end as proves, f.at`,
    [JSON.stringify(candidates)],
  );
}

// ---------------------------------------------------------------- campaign counters (campaigns.ts)

export async function addCampaignEngagement(em: EntityManager, campaignId: string, kind: 'opened' | 'clicked', count: number): Promise<void> {
  const column = kind === 'opened' ? 'emails_opened_count' : 'emails_clicked_count';
  await query(em, `update campaigns set ${column} = ${column} + ? where id = ?`, [count, campaignId]);
}

// ---------------------------------------------------------------- delivery feedback (provider-events.ts)

/** An email as the delivery-feedback recorder sees it, its row locked. */
export interface FeedbackEmail {
  id: string;
  organization_id: string;
  /** Bare, lower-cased `to`. */
  address: string;
  delivery_status: string | null;
}

const FEEDBACK_COLUMNS = `e.id, e.organization_id, email_bare_address(e.to_address) as address, e.delivery_status`;
const FEEDBACK_EMAIL = `select ${FEEDBACK_COLUMNS} from emails e`;

/** An email's copy recipients (cc, then bcc, as given: `addr` or `Name <addr>`), as one jsonb array. */
export const EMAIL_COPIES = `coalesce(e.cc, '[]'::jsonb) || coalesce(e.bcc, '[]'::jsonb)`;

/** An email a provider event names, with its copy recipients (the event may be about one). */
interface ProviderFeedbackEmail extends FeedbackEmail {
  copies: string[];
}

const PROVIDER_FEEDBACK_EMAIL = `select ${FEEDBACK_COLUMNS}, ${EMAIL_COPIES} as copies from emails e`;

/** The email a provider event names, by the Message-ID mailroom set, else by the relay's id; locked. */
export async function lockEmailByMessageId(em: EntityManager, ids: { messageId?: string; providerMessageId?: string }): Promise<ProviderFeedbackEmail | undefined> {
  // An id PostgreSQL cannot store names no email (and would fail the statement).
  if (ids.messageId && !unstorable(ids.messageId)) {
    const [email] = await query<ProviderFeedbackEmail>(em, `${PROVIDER_FEEDBACK_EMAIL} where e.message_id = ? limit 1 for update`, [ids.messageId]);
    if (email) return email;
  }
  if (ids.providerMessageId && !unstorable(ids.providerMessageId)) {
    const [email] = await query<ProviderFeedbackEmail>(em, `${PROVIDER_FEEDBACK_EMAIL} where e.provider_message_id = ? limit 1 for update`, [ids.providerMessageId]);
    if (email) return email;
  }
  return undefined;
}

/** The emails of a batch, locked in id order (two batches never wait for each other in a cycle). */
export async function lockEmails(em: EntityManager, ids: readonly string[]): Promise<FeedbackEmail[]> {
  if (ids.length === 0) return [];
  return query<FeedbackEmail>(em, `${FEEDBACK_EMAIL} where e.id = any(?::text[]) order by e.id for update`, [ids], 'mailroom_feedback_lock_emails');
}

export interface NewDeliveryEvent {
  emailId: string;
  organizationId: string;
  type: string;
  details: Record<string, unknown>;
}

/** The key of a provider event's uniqueness: email, type, and recipient ('' for the `to`). */
export const deliveryEventKey = (emailId: string, type: string, recipient: string | undefined) => `${emailId} ${type} ${recipient ?? ''}`;

/**
 * Inserts provider events, once per email, type and recipient (`details.recipient`, absent
 * for the `to`; the caller passes each key once); returns the keys (`deliveryEventKey`) of
 * the rows written now. A hard bounce after a soft one is news (the address is suppressed
 * from now on): it replaces the soft bounce's row and counts as written; any other repeat
 * changes nothing.
 */
export async function insertDeliveryEvents(em: EntityManager, events: readonly NewDeliveryEvent[], at: Date): Promise<Set<string>> {
  if (events.length === 0) return new Set();
  const rows = await query<{ email_id: string; type: string; recipient: string }>(
    em,
    `insert into email_events (email_id, organization_id, type, occurred_at, details)
     select v.email_id, v.organization_id, v.type, ?::timestamptz, v.details
     from jsonb_to_recordset(?::jsonb) as v(email_id text, organization_id text, type text, details jsonb)
     on conflict (email_id, type, (coalesce(details ->> 'recipient', ''))) where type in ('delivered', 'bounced', 'complained', 'delivery_delayed')
     do update set details = excluded.details, occurred_at = excluded.occurred_at
       where email_events.details ->> 'bounceType' = 'soft' and excluded.details ->> 'bounceType' = 'hard'
     returning email_id, type, coalesce(details ->> 'recipient', '') as recipient`,
    [at, JSON.stringify(events.map((e) => ({ email_id: e.emailId, organization_id: e.organizationId, type: e.type, details: e.details })))],
    'mailroom_feedback_events',
  );
  return new Set(rows.map((r) => deliveryEventKey(r.email_id, r.type, r.recipient || undefined)));
}

/** Sets the delivery status of emails (already decided by rank, rows locked). */
export async function setDeliveryStatuses(em: EntityManager, statuses: readonly { id: string; status: string }[]): Promise<void> {
  if (statuses.length === 0) return;
  await query(
    em,
    `update emails e set delivery_status = f.status, updated_at = now()
     from jsonb_to_recordset(?::jsonb) as f(id text, status text) where e.id = f.id`,
    [JSON.stringify(statuses)],
    'mailroom_feedback_statuses',
  );
}

/** Organization suppressions; an address already on the list keeps its first reason. */
export async function insertSuppressions(
  em: EntityManager,
  rows: readonly { organizationId: string; address: string; reason: 'hard_bounce' | 'complaint'; emailId: string }[],
  at: Date,
): Promise<void> {
  if (rows.length === 0) return;
  await query(
    em,
    `insert into suppressions (organization_id, address, reason, email_id, created_at)
     select f.organization_id, f.address, f.reason, f.email_id, ?::timestamptz
     from jsonb_to_recordset(?::jsonb) as f(organization_id text, address text, reason text, email_id text)
     on conflict (organization_id, address) do nothing`,
    [at, JSON.stringify(rows.map((r) => ({ organization_id: r.organizationId, address: r.address, reason: r.reason, email_id: r.emailId })))],
    'mailroom_feedback_suppressions',
  );
}

/**
 * The organizations' subscribers with these addresses become BOUNCED or COMPLAINED (one row
 * per organization and address). A complaint overrides a bounce; BANNED (an operator's
 * decision) stays. Returns the rows whose status changed, as they now are.
 */
export async function setSubscribersBounced(
  em: EntityManager,
  rows: readonly { organizationId: string; address: string; status: 'BOUNCED' | 'COMPLAINED' }[],
  at: Date,
): Promise<SubscriberRow[]> {
  if (rows.length === 0) return [];
  return query<SubscriberRow>(
    em,
    `update subscribers s set status = f.status, updated_at = ?::timestamptz
     from jsonb_to_recordset(?::jsonb) as f(organization_id text, address text, status text)
     where s.organization_id = f.organization_id and s.email = f.address
       and s.status not in ('COMPLAINED', 'BANNED') and (f.status = 'COMPLAINED' or s.status <> 'BOUNCED')
     returning s.*`,
    [at, JSON.stringify(rows.map((r) => ({ organization_id: r.organizationId, address: r.address, status: r.status })))],
    'mailroom_feedback_subscribers',
  );
}

/** Times to record per address in the global verification history (null: not this one). */
export interface HistoryOutcomes {
  email: string;
  domain: string;
  hard_bounced_at: Date | null;
  complained_at: Date | null;
  mailbox_full_at: Date | null;
  mailbox_not_found_at: Date | null;
  proven_at: Date | null;
}

// Each time keeps the latest of the stored and the new one (`greatest` ignores nulls).
const keep = (column: string) => `${column} = greatest(verification_history.${column}, excluded.${column})`;
// Built once: a named statement has one text (db/sql.ts).
const UPSERT_HISTORY = `insert into verification_history (email, domain, hard_bounced_at, complained_at, mailbox_full_at, mailbox_not_found_at, proven_at, updated_at)
     select f.email, f.domain, f.hard_bounced_at, f.complained_at, f.mailbox_full_at, f.mailbox_not_found_at, f.proven_at, ?::timestamptz
     from jsonb_to_recordset(?::jsonb) as f(email text, domain text, hard_bounced_at timestamptz, complained_at timestamptz,
       mailbox_full_at timestamptz, mailbox_not_found_at timestamptz, proven_at timestamptz)
     on conflict (email) do update set ${keep('hard_bounced_at')}, ${keep('complained_at')}, ${keep('mailbox_full_at')},
       ${keep('mailbox_not_found_at')}, ${keep('proven_at')}, updated_at = excluded.updated_at`;

/**
 * One upsert for a batch (one row per address): each time keeps the latest of the stored and
 * the new one, as `recordHardBounce` and its siblings do one at a time.
 */
export async function upsertHistory(em: EntityManager, rows: readonly HistoryOutcomes[], at: Date): Promise<void> {
  if (rows.length === 0) return;
  await query(em, UPSERT_HISTORY, [at, JSON.stringify(rows)], 'mailroom_feedback_history');
}

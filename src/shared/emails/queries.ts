import type { EntityManager } from '@mikro-orm/postgresql';
import type { ContentKind, EmailSource } from '../db/entities/email.js';
import { inTransaction, withConnection, type Sql } from '../db/sql.js';
import type { CampaignEmailParts } from '../campaigns/personalize.js';
import { emailEventColumns, emailEventsFrom, recordSentEmails } from '../webhooks/queries.js';
import type { NewEmail } from './input.js';

/**
 * The data-access module of emails: every statement on `emails` and
 * `email_idempotency_keys` that the accept path, the send path, the reconciler and the
 * reads run (docs/architecture.md, "Data access"). Typed rows in and out; the hot
 * statements are prepared once per connection (named) with bound values, through the one
 * raw-SQL helper (`Sql`). Other modules call these functions and never see SQL text.
 */

// ---------------------------------------------------------------------------------------
// Accepting mail (accept.ts): the rows go in as arrays (`unnest`), so the statement text is
// the same whatever the number of rows: parsed and planned once, values bound.

export const IDEMPOTENCY_TTL_HOURS = 24;

const COLUMNS = [
  'id',
  'organization_id',
  'source',
  'campaign_id',
  'subscriber_id',
  'from_address',
  'to_address',
  'cc',
  'bcc',
  'reply_to',
  'subject',
  'content_kind',
  'content',
  'preview',
  'text',
  'tags',
  'headers',
] as const;
const JSONB: ReadonlySet<string> = new Set(['cc', 'bcc', 'reply_to', 'tags', 'headers']);
const quote = (c: string) => `"${c}"`;
// The rows as parallel arrays, one a column; the JSON columns travel as text and are cast.
const rows = (columns: readonly string[]) => `unnest(${columns.map(() => '?::text[]').join(', ')}) as r(${columns.map(quote).join(', ')})`;
const SELECT_ROWS = COLUMNS.map((c) => (JSONB.has(c) ? `r.${quote(c)}::jsonb` : `r.${quote(c)}`)).join(', ');
const INSERT_INTO = `insert into emails (${COLUMNS.map(quote).join(', ')})`;

/** Emails only (no key): one statement. */
const INSERT_SQL = `${INSERT_INTO} select ${SELECT_ROWS} from ${rows(COLUMNS)}`;

/** A key scoped to its organization (keys are per organization), as a Map or Set key. */
export const scopedKey = (organizationId: string, key: string) => `${organizationId}\n${key}`;

/** The advisory lock a request holds on its key while it writes it (SQL, of two text expressions). */
export const idempotencyKeyLock = (organizationId: string, key: string) => `hashtextextended('mailroom:idempotency:' || ${organizationId} || E'\\n' || ${key}, 0)`;

/**
 * Keys and emails in one statement. `k` are the key rows (organization, key, hash, the
 * request's ids as an array literal); each email row carries its request's key (null when
 * the request has none) and is inserted only when that key was claimed here.
 *
 * A key that another request is writing now is never waited for (docs/emails.md "Idempotency-Key": 409 while the
 * first runs). Each key is first taken as a transaction-scoped advisory lock, without
 * waiting; a key whose lock another statement holds is left out and returned as not
 * claimed, and that request is answered 409 at once. The writer of a key row holds its lock
 * until it commits, so no two statements ever wait on each other's key rows (nor deadlock
 * on them, whatever the order of the keys). Every other lock is waited for, as an unkeyed
 * insert does: a `lock_timeout` would also cut short the waits of concurrent inserts on the
 * table's extension (docs/emails.md "Accepting mail"). `keys` is used twice and calls a
 * volatile function, so PostgreSQL evaluates it once.
 */
const INSERT_KEYED_SQL = `
  with keys as (
    select k.organization_id, k.idempotency_key, k.request_hash, k.email_ids,
           pg_try_advisory_xact_lock(${idempotencyKeyLock('k.organization_id', 'k.idempotency_key')}) as free
      from unnest(?::text[], ?::text[], ?::text[], ?::text[]) as k(organization_id, idempotency_key, request_hash, email_ids)
  ), claimed as (
    insert into email_idempotency_keys (organization_id, idempotency_key, request_hash, email_ids, created_at)
    select k.organization_id, k.idempotency_key, k.request_hash, k.email_ids::text[], now()
      from keys k
     where k.free
    on conflict (organization_id, idempotency_key) do update
      set request_hash = excluded.request_hash, email_ids = excluded.email_ids, created_at = excluded.created_at
      where email_idempotency_keys.created_at < now() - interval '${IDEMPOTENCY_TTL_HOURS} hours'
    returning organization_id, idempotency_key
  ), written as (
    ${INSERT_INTO}
    select ${SELECT_ROWS}
      from ${rows([...COLUMNS, 'key'])}
     where r."key" is null
        or exists (select 1 from claimed c where c.organization_id = r.organization_id and c.idempotency_key = r."key")
  )
  select organization_id, idempotency_key, true as claimed from claimed
  union all
  select organization_id, idempotency_key, false from keys where not free`;

/** The earlier requests' key rows, for the keys a statement did not claim. */
const EARLIER_SQL = `
  select organization_id, idempotency_key, request_hash, email_ids
    from email_idempotency_keys
   where (organization_id, idempotency_key) in (select * from unnest(?::text[], ?::text[]))`;

const json = (value: unknown) => (value === null || value === undefined ? null : JSON.stringify(value));

/** The email rows as one array a column, in COLUMNS order (plus each row's key when keyed). */
function columnArrays(inputs: readonly NewEmail[], ids: readonly string[], keys?: readonly (string | null)[]): unknown[] {
  const cols: unknown[][] = Array.from({ length: COLUMNS.length + (keys ? 1 : 0) }, () => new Array(inputs.length));
  inputs.forEach((e, i) => {
    cols[0]![i] = ids[i];
    cols[1]![i] = e.organizationId;
    cols[2]![i] = e.source ?? 'api';
    cols[3]![i] = e.campaignId ?? null;
    cols[4]![i] = e.subscriberId ?? null;
    cols[5]![i] = e.from;
    cols[6]![i] = e.to;
    cols[7]![i] = json(e.cc);
    cols[8]![i] = json(e.bcc);
    cols[9]![i] = json(e.replyTo);
    cols[10]![i] = e.subject;
    cols[11]![i] = e.contentKind;
    cols[12]![i] = e.content;
    cols[13]![i] = e.preview ?? null;
    cols[14]![i] = e.text ?? null;
    cols[15]![i] = JSON.stringify(e.tags ?? []);
    cols[16]![i] = JSON.stringify(e.headers ?? {});
    if (keys) cols[17]![i] = keys[i];
  });
  return cols;
}

/**
 * Inserts the rows (status queued) in ONE statement. With an EntityManager the statement
 * runs on its own (atomic); with a `Sql`, inside the caller's transaction.
 */
export async function insertEmailRows(db: EntityManager | Sql, inputs: readonly NewEmail[], ids: readonly string[]): Promise<void> {
  if (inputs.length === 0) return;
  const params = columnArrays(inputs, ids);
  if ('query' in db) await db.query(INSERT_SQL, params, 'mailroom_emails_insert');
  else await withConnection(db, (sql) => sql.query(INSERT_SQL, params, 'mailroom_emails_insert'));
}

/** A request's Idempotency-Key as written with its emails. */
export interface KeyRow {
  organizationId: string;
  key: string;
  requestHash: string;
  emailIds: readonly string[];
}

/** An Idempotency-Key row written by an earlier request. */
export interface EarlierKey {
  organization_id: string;
  idempotency_key: string;
  request_hash: string;
  email_ids: string[];
}

export interface KeyOwner {
  organization_id: string;
  idempotency_key: string;
}

/**
 * Keyed requests, in one transaction: the key rows and the emails whose key was claimed go
 * in as one statement; then `earlier` are read for the keys it neither claimed nor found
 * `busy` (another request writing them now). The read is inside the transaction so that
 * when it fails, nothing is committed and the caller may write the requests again
 * (accept.ts writeOrSplit) without writing an email twice.
 */
export async function insertKeyedEmails(
  em: EntityManager,
  input: { keys: readonly KeyRow[]; emails: readonly NewEmail[]; ids: readonly string[]; rowKeys: readonly (string | null)[] },
): Promise<{ claimed: KeyOwner[]; busy: KeyOwner[]; earlier: EarlierKey[] }> {
  return inTransaction(em, async (sql) => {
    const rows = await sql.query<KeyOwner & { claimed: boolean }>(
      INSERT_KEYED_SQL,
      [
        input.keys.map((k) => k.organizationId),
        input.keys.map((k) => k.key),
        input.keys.map((k) => k.requestHash),
        // A PG array literal: ids are [0-9a-z_] only.
        input.keys.map((k) => `{${k.emailIds.join(',')}}`),
        ...columnArrays(input.emails, input.ids, input.rowKeys),
      ],
      'mailroom_emails_insert_keyed',
    );
    const answered = new Set(rows.map((r) => scopedKey(r.organization_id, r.idempotency_key)));
    const missing = input.keys.filter((k) => !answered.has(scopedKey(k.organizationId, k.key)));
    const earlier = missing.length === 0 ? [] : await sql.query<EarlierKey>(EARLIER_SQL, [missing.map((m) => m.organizationId), missing.map((m) => m.key)]);
    return { claimed: rows.filter((r) => r.claimed), busy: rows.filter((r) => !r.claimed), earlier };
  });
}

/** Deletes Idempotency-Key rows past their 24 h; returns how many. */
export async function deleteExpiredIdempotencyKeys(em: EntityManager): Promise<number> {
  const found = await em.execute<{ n: string }[]>(
    `with gone as (delete from email_idempotency_keys where created_at < now() - interval '${IDEMPOTENCY_TTL_HOURS} hours' returning 1)
     select count(*) as n from gone`,
    [],
    'all',
  );
  return Number(found[0]?.n ?? 0);
}

// ---------------------------------------------------------------------------------------
// The send path (deliver.ts). Rows are found by primary key (`id = any($1)`): a join with a
// set-returning function of the ids was estimated at 100 rows and planned as a scan of every
// pending email, which made each batch cost milliseconds of PostgreSQL's CPU while a
// campaign or a backlog was queued.

export const SUPPRESSED_REASON = 'suppressed';
/**
 * The reason of an email whose final `.` reached the provider but whose answer was never
 * read (its worker died, or the connection dropped): the provider may or may not have it.
 * Never retried, so that it is never sent twice; an operator can list them by this reason.
 */
export const UNCERTAIN_REASON = 'uncertain: handed to the provider but its answer was never read; not retried so that it is never sent twice';
export const UNSUBSCRIBED_REASON = 'recipient no longer subscribed';
export const INTERRUPTED_REASON = 'interrupted while being handed to the provider; not retried so that it is never sent twice';

export interface ClaimedRow extends CampaignEmailParts {
  id: string;
  organization_id: string;
  from_address: string;
  to_address: string;
  cc: string[] | null;
  bcc: string[] | null;
  reply_to: string[] | null;
  subject: string;
  content_kind: ContentKind;
  content: string;
  preview: string | null;
  text: string | null;
  headers: Record<string, string>;
  /** The organization's tracking settings. */
  track_opens: boolean;
  track_clicks: boolean;
  campaign_id: string | null;
  /** Suppressed recipients (bare addresses), left out of the SMTP envelope; null when none. */
  skip: string[] | null;
}

/** What the "sent" write-back records of one email. */
export interface SentRecord {
  id: string;
  message_id: string;
  /** The relay's own id of the message, from its `250` answer (provider webhooks match by it). */
  provider_message_id?: string;
  html: string;
  text: string;
  /** A campaign email's personalised subject (its row holds the template's until sent). */
  subject?: string;
  delivered: boolean;
}

const CLAIMED_COLUMNS = 'organization_id, from_address, to_address, cc, bcc, reply_to, subject, content_kind, content, preview, text, headers, campaign_id, subscriber_id';
const columnsOf = (alias: string) => CLAIMED_COLUMNS.replace(/(\w+)/g, `${alias}.$1`);
// A campaign email's row has no body: its template (rendered once by the fan-out) and its
// subscriber come with the claim, to be personalised by the worker.
const CAMPAIGN_PARTS = `t.subject as template_subject, t.html as template_html, t.text as template_text,
  s.name as subscriber_name, s.fields as subscriber_fields`;
const CAMPAIGN_JOINS = (alias: string) => `
  left join campaign_templates t on ${alias}.content_kind = 'campaign' and t.campaign_id = ${alias}.campaign_id
  left join subscribers s on ${alias}.content_kind = 'campaign' and s.id = ${alias}.subscriber_id`;

/** Of an email `e`: its `to` recipient is on its organization's suppression list. */
const TO_SUPPRESSED = `exists (select 1 from suppressions s where s.organization_id = e.organization_id and s.address = email_bare_address(e.to_address))`;

/**
 * Of an email `e` with `cc` or `bcc`: `{ skipped: [bare addresses on the suppression list],
 * live: count of the others }` over its copy recipients. Each address is an index lookup (a
 * left join: an exists() here was planned as a hashed scan of the whole list).
 */
const COPIES = `(
  select jsonb_build_object(
    'skipped', coalesce(jsonb_agg(rc.address) filter (where rc.suppressed), '[]'::jsonb),
    'live', count(*) filter (where not rc.suppressed))
  from (select distinct a.address, (cs.address is not null) as suppressed
        from jsonb_array_elements_text(coalesce(e.cc, '[]'::jsonb) || coalesce(e.bcc, '[]'::jsonb)) as x(raw)
        cross join lateral (select email_bare_address(x.raw) as address) a
        left join suppressions cs on cs.organization_id = e.organization_id and cs.address = a.address) rc)`;

/** Of an email `e`: every suppressed recipient (`to`, `cc`, `bcc`), a jsonb array. */
const SKIPPED_RECIPIENTS = `(
  case when ${TO_SUPPRESSED} then jsonb_build_array(email_bare_address(e.to_address)) else '[]'::jsonb end
  || case when e.cc is null and e.bcc is null then '[]'::jsonb else ${COPIES} -> 'skipped' end)`;

/**
 * The claim of a batch: queued -> sending, returning each row with what sending it needs.
 * The send gate of outcomes is applied here, in the same statement: an email whose
 * recipients (`to`, `cc`, `bcc`) are all suppressed in its organization, or a campaign email
 * whose contact unsubscribed, was deleted or moved to another address since the fan-out (the
 * row's address may now be another contact's, or no one's), is failed instead of
 * claimed, so it is never sent; the suppressed copies of the others are returned (left out of
 * the envelope) with the organization's tracking settings.
 */
const CLAIM_SQL = `
  with r as (
    select e.id, ${TO_SUPPRESSED} as to_suppressed, email_bare_address(e.to_address) as to_bare,
      case when e.cc is null and e.bcc is null then null else ${COPIES} end as copies,
      (e.source = 'campaign' and not exists (
        select 1 from subscribers s where s.id = e.subscriber_id and s.status = 'SUBSCRIBED' and s.email = email_bare_address(e.to_address))) as unsubscribed
    from emails e where e.id = any(?::text[]) and e.status = 'queued'),
  c as (
    select r.*, (r.to_suppressed and coalesce((r.copies ->> 'live')::int, 0) = 0) as suppressed,
      case when r.to_suppressed then jsonb_build_array(r.to_bare) || coalesce(r.copies -> 'skipped', '[]'::jsonb)
        else r.copies -> 'skipped' end as skip
    from r),
  failed as (
    update emails e set status = 'failed', updated_at = now(),
      failure_reason = case when c.suppressed then '${SUPPRESSED_REASON}' else '${UNSUBSCRIBED_REASON}' end
    from c where e.id = c.id and (c.suppressed or c.unsubscribed) and e.status = 'queued'
    returning ${emailEventColumns('e')}),
  failed_events as (${emailEventsFrom('failed', 'email.failed')}),
  claimed as (
    update emails e set status = 'sending', claimed_at = now(), attempts = e.attempts + 1, updated_at = now()
    from c where e.id = c.id and not (c.suppressed or c.unsubscribed) and e.status = 'queued'
    returning e.id, ${columnsOf('e')})
  select cl.id, null as failed, ${columnsOf('cl')}, o.track_opens, o.track_clicks, ${CAMPAIGN_PARTS}, c.skip
  from claimed cl join c on c.id = cl.id join organizations o on o.id = cl.organization_id ${CAMPAIGN_JOINS('cl')}
  union all
  select f.id, f.failure_reason, ${CLAIMED_COLUMNS.replace(/(\w+)/g, 'null')}, null, null, null, null, null, null, null, null from failed f`;

/**
 * Claims the queued emails among `ids`: their rows, or the reason each was failed instead
 * (suppressed, unsubscribed), whose `email.failed` outbox rows the same statement writes.
 */
export async function claimEmails(em: EntityManager, ids: readonly string[]): Promise<(ClaimedRow & { failed: string | null })[]> {
  return withConnection(em, (sql) => sql.query<ClaimedRow & { failed: string | null }>(CLAIM_SQL, [ids], 'mailroom_emails_claim'));
}

// Campaign counters move as the provider accepts (emailsSentCount).
const SENT_SQL = `
  with sent as (update emails e set status = 'sent',
      delivery_status = case when v.delivered then 'delivered' else e.delivery_status end,
      message_id = v.message_id, provider_message_id = v.provider_message_id, html = v.html, text = v.text, subject = coalesce(v.subject, e.subject),
      sent_at = now(), failure_reason = null, updated_at = now()
    from jsonb_to_recordset(?::jsonb) as v(id text, message_id text, provider_message_id text, html text, text text, subject text, delivered boolean)
    where e.id = any(?::text[]) and e.id = v.id
      and (e.status = 'sending' or (e.status = 'failed' and e.failure_reason = '${UNCERTAIN_REASON}'))
    returning e.campaign_id, e.source)
  update campaigns c set emails_sent_count = c.emails_sent_count + s.n
  from (select campaign_id, count(*)::int as n from sent where source = 'campaign' and campaign_id is not null group by campaign_id) s
  where c.id = s.campaign_id`;

/**
 * The "sent" write-back of a group of emails the provider accepted, and their `email.sent`
 * (and `email.delivered`) webhook outbox rows, in one transaction.
 */
export async function recordSent(em: EntityManager, records: readonly SentRecord[]): Promise<void> {
  const ids = records.map((r) => r.id);
  await inTransaction(em, async (sql) => {
    await sql.query(SENT_SQL, [JSON.stringify(records), ids], 'mailroom_emails_sent');
    await recordSentEmails(sql, ids);
  });
}

const RECLAIM_SQL = `
  with r as (
    update emails e set claimed_at = now(), attempts = e.attempts + 1, updated_at = now()
    from organizations o
    where e.id = ? and e.status = 'sending' and o.id = e.organization_id
    returning e.id, ${columnsOf('e')}, o.track_opens, o.track_clicks, ${SKIPPED_RECIPIENTS} as skip)
  select r.*, ${CAMPAIGN_PARTS} from r ${CAMPAIGN_JOINS('r')}`;

/** A new claim time and attempt for a `sending` row; undefined when it is no longer `sending`. */
export async function reclaimEmail(em: EntityManager, id: string): Promise<ClaimedRow | undefined> {
  const [row] = await withConnection(em, (sql) => sql.query<ClaimedRow>(RECLAIM_SQL, [id], 'mailroom_emails_reclaim'));
  return row;
}

/**
 * Claimed (`sending`) emails failed with `reason`, with their `email.failed` outbox rows, in
 * one statement; with `claimedMsAgo`, only those claimed at least that long ago (the
 * reconciler's lease). `message`: what was rendered for the provider (the one email of a
 * worker's failed hand-over), stored as a sent email's is. Returns how many changed.
 */
export async function failClaimedEmails(
  em: EntityManager,
  ids: readonly string[],
  reason: string,
  claimedMsAgo = 0,
  message?: Pick<SentRecord, 'html' | 'text' | 'subject'>,
): Promise<number> {
  if (ids.length === 0) return 0;
  const changed = await withConnection(em, (sql) =>
    sql.query<{ id: string }>(
      `with changed as (
         update emails e set status = 'failed', failure_reason = ?, updated_at = now(),
           html = coalesce(?::text, e.html), text = coalesce(?::text, e.text), subject = coalesce(?::text, e.subject)
         where e.id = any(?::text[]) and e.status = 'sending' and e.claimed_at <= now() - (? * interval '1 millisecond')
         returning ${emailEventColumns('e')}),
       events as (${emailEventsFrom('changed', 'email.failed')})
       select id from changed`,
      [reason, message?.html ?? null, message?.text ?? null, message?.subject ?? null, ids, claimedMsAgo],
      'mailroom_emails_fail',
    ),
  );
  return changed.length;
}

/** A claimed (`sending`) email given back (`queued`), with the reason of the failed attempt when there is one. */
export async function releaseClaimedEmail(em: EntityManager, id: string, reason?: string): Promise<void> {
  await withConnection(em, (sql) =>
    reason === undefined
      ? sql.query(`update emails set status = 'queued', updated_at = now() where id = ? and status = 'sending'`, [id])
      : sql.query(`update emails set status = 'queued', failure_reason = ?, updated_at = now() where id = ? and status = 'sending'`, [reason, id]),
  );
}

/** The status of an email; 'missing' when there is no such row. */
export async function emailStatus(em: EntityManager, id: string): Promise<string> {
  const [row] = await withConnection(em, (sql) => sql.query<{ status: string }>('select status from emails where id = ?', [id]));
  return row?.status ?? 'missing';
}

// ---------------------------------------------------------------------------------------
// The reconciler (workers/emails.ts).

/** Emails claimed (`sending`) longer ago than `leaseMs`, oldest first (at most 10,000). */
export async function staleClaims(em: EntityManager, leaseMs: number): Promise<{ id: string; source: EmailSource }[]> {
  return em.execute<{ id: string; source: EmailSource }[]>(
    `select id, source from emails where status = 'sending' and claimed_at < now() - (? * interval '1 millisecond') order by id limit 10000`,
    [leaseMs],
    'all',
  );
}

/**
 * Stale claims the provider is known to have accepted: sent, with their campaigns counted and
 * their `email.sent` outbox rows, in one transaction (as the send path's write-back).
 */
export async function markStaleClaimsSent(em: EntityManager, accepted: readonly { id: string; message_id: string }[]): Promise<void> {
  if (accepted.length === 0) return;
  await inTransaction(em, async (sql) => {
    await sql.query(
      `with sent as (update emails e set status = 'sent', message_id = v.message_id, sent_at = now(), failure_reason = null, updated_at = now()
         from jsonb_to_recordset(?::jsonb) as v(id text, message_id text)
         where e.id = v.id and e.status = 'sending'
         returning e.campaign_id, e.source)
       update campaigns c set emails_sent_count = c.emails_sent_count + s.n
       from (select campaign_id, count(*)::int as n from sent where source = 'campaign' and campaign_id is not null group by campaign_id) s
       where c.id = s.campaign_id`,
      [JSON.stringify(accepted)],
    );
    await recordSentEmails(
      sql,
      accepted.map((a) => a.id),
    );
  });
}

/**
 * One keyset page of queued emails older than `graceMs` (and created before
 * `createdBefore`, when given).
 */
export async function queuedEmailsPage(
  em: EntityManager,
  options: { graceMs: number; afterId?: string; limit: number; createdBefore?: Date },
): Promise<{ id: string; source: 'api' | 'campaign' | 'test' }[]> {
  return em.execute(
    `select id, source from emails
     where status in ('queued', 'sending') and status = 'queued' and id > ? and created_at < now() - (? * interval '1 millisecond')
       and created_at < coalesce(?::timestamptz, 'infinity')
     order by id limit ?`,
    [options.afterId ?? '', options.graceMs, options.createdBefore?.toISOString() ?? null, options.limit],
    'all',
  );
}

// ---------------------------------------------------------------------------------------
// Reads.

/** An event of an email's timeline, as recorded. */
export interface EmailEventRow {
  type: 'delivered' | 'bounced' | 'complained' | 'open' | 'click';
  occurred_at: Date;
  url: string | null;
  details: Record<string, unknown> | null;
}

/** The recorded events of one email, oldest first, at most `limit`. */
export async function emailEvents(em: EntityManager, email: { id: string; organizationId: string }, limit: number): Promise<EmailEventRow[]> {
  return em.execute<EmailEventRow[]>(
    `select type, occurred_at, url, details from email_events
      where email_id = ? and organization_id = ? order by occurred_at limit ?`,
    [email.id, email.organizationId, limit],
    'all',
  );
}

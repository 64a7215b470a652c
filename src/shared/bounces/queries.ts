import type { EntityManager } from '@mikro-orm/postgresql';
import { sqlOf, withConnection } from '../db/sql.js';
import { EMAIL_COPIES } from '../outcomes/queries.js';
import { newId } from '../ids.js';

/**
 * Data access of the inbound reports (table `inbound_reports`): the listener stores what it
 * received, the worker reads it and records what it meant. Every statement of the feature
 * is here. The statements a job runs are named (prepared once per connection, db/sql.ts):
 * planned anew each time, their planning cost PostgreSQL a sixth of their execution.
 */

/** `rpt_` + a lower-case ULID: sortable by arrival, and usable as a BullMQ job id. */
export function newReportId(): string {
  return newId('rpt');
}

export interface NewReport {
  id: string;
  emailId: string;
  mailFrom: string;
  rcptTo: string;
  raw: Buffer;
}

// Statements prepared once per connection: one a group size up to this many rows (the listener
// writes groups of a few messages); larger groups are planned each time.
const MAX_PREPARED_ROWS = 8;

/** `insert … values (…), (…)` for `rows` reports, each row's raw bytes its own bound parameter. */
function insertText(rows: number): string {
  const tuples = Array.from({ length: rows }, () => '(?, ?, ?, ?, ?::bytea, ?::int, ?::timestamptz)');
  return `insert into inbound_reports (id, email_id, mail_from, rcpt_to, raw, size, received_at) values ${tuples.join(', ')}`;
}
// Made once: db/sql.ts keeps the numbered form of a text it has seen.
// Index n holds the text of n rows (index 0 unused: a group has a report at least).
const PREPARED_TEXTS = Array.from({ length: MAX_PREPARED_ROWS + 1 }, (_, rows) => (rows === 0 ? '' : insertText(rows)));

/**
 * The reports of one group commit in one statement (its own implicit transaction, durable
 * when it returns), on a pooled connection without the ORM's per-statement cost. Each raw
 * report is a parameter of its own, so it travels as binary: in a bound array (`bytea[]`) it
 * would be written out in hex and parsed back, twice its size each way.
 */
export async function insertReports(em: EntityManager, reports: NewReport[], receivedAt: Date): Promise<void> {
  if (reports.length === 0) return;
  const values: unknown[] = [];
  for (const r of reports) values.push(r.id, r.emailId, r.mailFrom, r.rcptTo, r.raw, r.raw.length, receivedAt);
  const name = reports.length <= MAX_PREPARED_ROWS ? `mailroom_insert_inbound_reports_${reports.length}` : undefined;
  await withConnection(em, (sql) => sql.query(PREPARED_TEXTS[reports.length] ?? insertText(reports.length), values, name));
}

export interface StoredReport {
  id: string;
  email_id: string;
  mail_from: string;
  rcpt_to: string;
  raw: Buffer;
}

/** The reports among `ids` still to be read. */
export async function pendingReports(em: EntityManager, ids: string[]): Promise<StoredReport[]> {
  return sqlOf(em).query<StoredReport>(
    `select id, email_id, mail_from, rcpt_to, raw from inbound_reports where id in (select jsonb_array_elements_text(?::jsonb)) and status = 'received' order by id`,
    [JSON.stringify(ids)],
    'mailroom_inbound_pending',
  );
}

/**
 * Locks the reports among `ids` still unread, in the caller's transaction; returns them. A
 * concurrent run waits for the locks, then finds them read: one report has one effect.
 */
export async function claimReports(em: EntityManager, ids: string[]): Promise<Set<string>> {
  const rows = await sqlOf(em).query<{ id: string }>(
    `select id from inbound_reports where id in (select jsonb_array_elements_text(?::jsonb)) and status = 'received' order by id for update`,
    [JSON.stringify(ids)],
    'mailroom_inbound_claim',
  );
  return new Set(rows.map((r) => r.id));
}

/** Records what each report meant, in one statement (after `claimReports`, in the same transaction). */
export async function finishReports(em: EntityManager, reports: { id: string; outcome: { status: 'applied' | 'ignored' } }[], at: Date): Promise<void> {
  if (reports.length === 0) return;
  await sqlOf(em).query(
    `update inbound_reports r set status = f.outcome ->> 'status', outcome = f.outcome, processed_at = ?
     from jsonb_to_recordset(?::jsonb) as f(id text, outcome jsonb)
     where r.id = f.id and r.status = 'received'`,
    [at, JSON.stringify(reports)],
    'mailroom_inbound_finish',
  );
}

export interface ReportEmail {
  id: string;
  organization_id: string;
  message_id: string | null;
  from_address: string;
  /** Bare, lower-cased `to`. */
  address: string;
  /** The `cc` and `bcc` recipients as sent (`addr` or `Name <addr>`). */
  copies: string[];
}

const EMAIL_COLUMNS = `e.id, e.organization_id, e.message_id, e.from_address, email_bare_address(e.to_address) as address, ${EMAIL_COPIES} as copies`;

export async function emailsById(em: EntityManager, ids: string[]): Promise<Map<string, ReportEmail>> {
  const rows = await sqlOf(em).query<ReportEmail>(
    `select ${EMAIL_COLUMNS} from emails e where e.id in (select jsonb_array_elements_text(?::jsonb))`,
    [JSON.stringify(ids)],
    'mailroom_inbound_emails',
  );
  return new Map(rows.map((r) => [r.id, r]));
}

/** The emails with these Message-IDs, by Message-ID (one query for a batch of reports). */
export async function emailsByMessageId(em: EntityManager, messageIds: string[]): Promise<Map<string, ReportEmail>> {
  if (messageIds.length === 0) return new Map();
  const rows = await sqlOf(em).query<ReportEmail>(
    `select ${EMAIL_COLUMNS} from emails e where e.message_id in (select jsonb_array_elements_text(?::jsonb))`,
    [JSON.stringify(messageIds)],
    'mailroom_inbound_emails_by_message_id',
  );
  const byMessageId = new Map<string, ReportEmail>();
  for (const row of rows) if (!byMessageId.has(row.message_id!)) byMessageId.set(row.message_id!, row);
  return byMessageId;
}

/** Reports stored longer ago than `before` and still unread: their job was lost (Redis). */
export async function unreadReportIds(em: EntityManager, before: Date, limit: number): Promise<string[]> {
  const rows = await sqlOf(em).query<{ id: string }>(
    `select id from inbound_reports where status = 'received' and received_at < ? order by received_at limit ?`,
    [before, limit],
  );
  return rows.map((r) => r.id);
}

/** Deletes read reports older than `before`, at most `limit` of them; returns how many. */
export async function purgeReports(em: EntityManager, before: Date, limit: number): Promise<number> {
  const rows = await sqlOf(em).query<{ id: string }>(
    `delete from inbound_reports where id in (select id from inbound_reports where status <> 'received' and processed_at < ? limit ?) returning id`,
    [before, limit],
  );
  return rows.length;
}

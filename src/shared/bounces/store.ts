import type { EntityManager } from '@mikro-orm/postgresql';
import { monotonicFactory } from 'ulid';
import { TO_ADDRESS_SQL } from '../outcomes/send-gate.js';

/**
 * Data access of the inbound reports (table `inbound_reports`): the listener stores what it
 * received, the worker reads it and records what it meant. Every statement of the feature
 * is here.
 */

const ulid = monotonicFactory();

/** `rpt_` + a lower-case ULID: sortable by arrival, and usable as a BullMQ job id. */
export function newReportId(): string {
  return `rpt_${ulid().toLowerCase()}`;
}

export interface NewReport {
  id: string;
  emailId: string;
  mailFrom: string;
  rcptTo: string;
  raw: Buffer;
}

/** One statement for every recipient of one SMTP transaction. */
export async function insertReports(em: EntityManager, reports: NewReport[], receivedAt: Date): Promise<void> {
  if (reports.length === 0) return;
  const values = reports.map(() => '(?, ?, ?, ?, ?, ?, ?)').join(', ');
  const params = reports.flatMap((r) => [r.id, r.emailId, r.mailFrom, r.rcptTo, r.raw.length, r.raw, receivedAt]);
  await em.execute(`insert into inbound_reports (id, email_id, mail_from, rcpt_to, size, raw, received_at) values ${values}`, params, 'run');
}

export interface StoredReport {
  id: string;
  email_id: string;
  mail_from: string;
  rcpt_to: string;
  raw: Buffer;
}

/** A report still to be read, or undefined when it is unknown or already read. */
export async function pendingReport(em: EntityManager, id: string): Promise<StoredReport | undefined> {
  const [row] = await em.execute<StoredReport[]>(
    `select id, email_id, mail_from, rcpt_to, raw from inbound_reports where id = ? and status = 'received'`,
    [id],
    'all',
  );
  return row;
}

/**
 * Locks a report still unread, in the caller's transaction; false when another run has read
 * it (a concurrent run waits for the lock, then finds it read: one report has one effect).
 */
export async function claimReport(em: EntityManager, id: string): Promise<boolean> {
  const rows = await em.execute<{ id: string }[]>(`select id from inbound_reports where id = ? and status = 'received' for update`, [id], 'all');
  return rows.length > 0;
}

/** Records what the report meant (after `claimReport`, in the same transaction). */
export async function finishReport(em: EntityManager, id: string, status: 'applied' | 'ignored', outcome: object, at: Date): Promise<boolean> {
  const rows = await em.execute<{ id: string }[]>(
    `update inbound_reports set status = ?, outcome = ?::jsonb, processed_at = ? where id = ? and status = 'received' returning id`,
    [status, JSON.stringify(outcome), at, id],
    'all',
  );
  return rows.length > 0;
}

export interface ReportEmail {
  id: string;
  organization_id: string;
  message_id: string | null;
  from_address: string;
  /** Bare, lower-cased `to`. */
  address: string;
  has_copies: boolean;
}

const EMAIL_COLUMNS = `e.id, e.organization_id, e.message_id, e.from_address, ${TO_ADDRESS_SQL} as address,
  (coalesce(jsonb_array_length(e.cc), 0) + coalesce(jsonb_array_length(e.bcc), 0)) > 0 as has_copies`;

export async function emailById(em: EntityManager, id: string): Promise<ReportEmail | undefined> {
  const [row] = await em.execute<ReportEmail[]>(`select ${EMAIL_COLUMNS} from emails e where e.id = ?`, [id], 'all');
  return row;
}

export async function emailByMessageId(em: EntityManager, messageId: string): Promise<ReportEmail | undefined> {
  const [row] = await em.execute<ReportEmail[]>(`select ${EMAIL_COLUMNS} from emails e where e.message_id = ? limit 1`, [messageId], 'all');
  return row;
}

/** Reports stored longer ago than `before` and still unread: their job was lost (Redis). */
export async function unreadReportIds(em: EntityManager, before: Date, limit: number): Promise<string[]> {
  const rows = await em.execute<{ id: string }[]>(
    `select id from inbound_reports where status = 'received' and received_at < ? order by received_at limit ?`,
    [before, limit],
    'all',
  );
  return rows.map((r) => r.id);
}

/** Deletes read reports older than `before`, at most `limit` of them; returns how many. */
export async function purgeReports(em: EntityManager, before: Date, limit: number): Promise<number> {
  const rows = await em.execute<{ id: string }[]>(
    `delete from inbound_reports where id in (select id from inbound_reports where status <> 'received' and processed_at < ? limit ?) returning id`,
    [before, limit],
    'all',
  );
  return rows.length;
}

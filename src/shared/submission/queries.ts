import type { EntityManager } from '@mikro-orm/postgresql';
import { withConnection } from '../db/sql.js';
import type { NewEmail } from '../emails/input.js';
import { createEmails, type CreateEmailsDeps } from '../emails/service.js';
import type { SubmittedAttachment, SubmittedMessage } from './message.js';

/**
 * The data-access module of SMTP submission: the email row goes through the emails
 * service (the one `POST /api/v2/emails` uses), and the envelope, kept headers and
 * attachments are written in the same transaction, so a message is stored whole or not
 * at all; its send job is enqueued after the commit.
 */

function submittedEmail(organizationId: string, message: SubmittedMessage): NewEmail {
  return {
    organizationId,
    source: 'api',
    from: message.from,
    to: message.to,
    subject: message.subject,
    contentKind: 'message',
    content: message.html,
    text: message.text,
    replyTo: message.replyTo,
    cc: message.cc,
    bcc: message.bcc,
    tags: message.tags,
  };
}

/** Stores the message as one email of the organization; answers its id once committed. */
export async function storeSubmission(em: EntityManager, deps: CreateEmailsDeps, organizationId: string, message: SubmittedMessage): Promise<string> {
  const { ids } = await createEmails(em, deps, [submittedEmail(organizationId, message)], {
    alongside: async (sql, [id]) => {
      await sql.query('insert into email_submissions (email_id, envelope_to, headers) values ($1, $2::text[], $3::jsonb)', [
        id,
        message.envelopeTo,
        JSON.stringify(message.headers),
      ]);
      if (message.attachments.length === 0) return;
      const params: unknown[] = [];
      message.attachments.forEach((a, i) => params.push(id, i, a.filename, a.contentType, a.disposition, a.contentId, a.content.length, a.content));
      const rows = message.attachments.map((_, i) => `(${Array.from({ length: 8 }, (__, j) => `$${i * 8 + j + 1}`).join(', ')})`);
      await sql.query(`insert into email_attachments (email_id, position, filename, content_type, disposition, content_id, size, content) values ${rows.join(', ')}`, params);
    },
  });
  return ids[0]!;
}

/** What the delivery of a submitted message needs besides the email row. */
export interface SubmittedParts {
  envelopeTo: string[];
  headers: [string, string][];
  attachments: SubmittedAttachment[];
}

/** The envelope, kept headers and attachments of a submitted email; undefined when it has none. */
export async function loadSubmittedParts(em: EntityManager, emailId: string): Promise<SubmittedParts | undefined> {
  const found = await withConnection(em, async (sql) => {
    const [row] = await sql.query<{ envelope_to: string[]; headers: [string, string][] }>('select envelope_to, headers from email_submissions where email_id = ?', [emailId]);
    if (!row) return undefined;
    const attachments = await sql.query<{ filename: string | null; content_type: string; disposition: 'attachment' | 'inline' | 'alternative'; content_id: string | null; content: Buffer }>(
      'select filename, content_type, disposition, content_id, content from email_attachments where email_id = ? order by position',
      [emailId],
    );
    return { row, attachments };
  });
  if (!found) return undefined;
  const { row, attachments } = found;
  return {
    envelopeTo: row.envelope_to,
    headers: row.headers,
    attachments: attachments.map((a) => ({ filename: a.filename, contentType: a.content_type, disposition: a.disposition, contentId: a.content_id, content: a.content })),
  };
}

export interface AttachmentSummary {
  filename: string | null;
  content_type: string;
  size: number;
}

/** The attachments of an email as `GET /api/v2/emails/{id}` lists them (docs/smtp.md "From a message to an email"); no content read. */
export async function listAttachments(em: EntityManager, emailId: string): Promise<AttachmentSummary[]> {
  return withConnection(em, (sql) => sql.query<AttachmentSummary>(
      // The media type alone: the stored type keeps its parameters for the delivery.
      "select filename, split_part(content_type, ';', 1) as content_type, size from email_attachments where email_id = ? order by position",
      [emailId],
    ));
}

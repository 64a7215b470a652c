import { Migration } from '@mikro-orm/migrations';

/**
 * Messages submitted over SMTP (docs/smtp.md). The email row (content kind
 * `message`) holds what the API shows: from, to, cc, bcc, subject, html (`content`, empty
 * when the message has no HTML part) and text. What only the delivery needs lives beside it:
 * the SMTP envelope and the headers kept as submitted (`email_submissions`), and the
 * attachments, byte for byte (`email_attachments`). Both go with their email (cascade), so
 * retention and organization deletion purge them.
 */
export class Migration20261125070000Submissions extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create table email_submissions (
        email_id text collate "C" primary key references emails (id) on delete cascade,
        envelope_to text[] not null,
        headers jsonb not null default '[]'
      )`);
    this.addSql(`
      create table email_attachments (
        email_id text collate "C" not null references emails (id) on delete cascade,
        position smallint not null,
        filename text,
        content_type text not null,
        disposition text not null check (disposition in ('attachment', 'inline')),
        content_id text,
        size integer not null,
        content bytea not null,
        primary key (email_id, position)
      )`);
    // Wider than the check it replaces, so the rows already there satisfy it: not re-checked.
    this.addSql(`alter table emails drop constraint emails_content_kind_check`);
    this.addSql(`alter table emails add constraint emails_content_kind_check check (content_kind in ('html', 'markdown', 'tiptap', 'campaign', 'message')) not valid`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table emails drop constraint emails_content_kind_check`);
    this.addSql(`alter table emails add constraint emails_content_kind_check check (content_kind in ('html', 'markdown', 'tiptap', 'campaign')) not valid`);
    this.addSql('drop table if exists email_attachments');
    this.addSql('drop table if exists email_submissions');
  }
}

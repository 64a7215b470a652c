import { Migration } from '@mikro-orm/migrations';

/**
 * A part submitted over SMTP beside the text and HTML (a calendar invitation, AMP) is kept
 * as `alternative` and delivered in multipart/alternative again (docs/smtp.md). Wider than
 * the check it replaces, so the rows already there satisfy it: not re-checked.
 */
export class Migration20261208020000AttachmentAlternative extends Migration {
  override async up(): Promise<void> {
    this.addSql('alter table email_attachments drop constraint email_attachments_disposition_check');
    this.addSql(`alter table email_attachments add constraint email_attachments_disposition_check check (disposition in ('attachment', 'inline', 'alternative')) not valid`);
  }

  override async down(): Promise<void> {
    this.addSql(`update email_attachments set disposition = 'attachment' where disposition = 'alternative'`);
    this.addSql('alter table email_attachments drop constraint email_attachments_disposition_check');
    this.addSql(`alter table email_attachments add constraint email_attachments_disposition_check check (disposition in ('attachment', 'inline'))`);
  }
}

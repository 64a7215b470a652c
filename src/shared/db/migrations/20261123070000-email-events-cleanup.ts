import { Migration } from '@mikro-orm/migrations';

/**
 * `email_events` has no foreign key (the hot insert of every pixel and click, see
 * 20261123060000-outcomes), so deleting an organization, which cascades to its `emails`,
 * left their events behind. A statement-level trigger on `emails` deletes the events of the
 * rows a statement (or a cascade) removes: nothing is added to the insert path, and the
 * delete finds the events through `email_events_email_idx`.
 */
export class Migration20261123070000EmailEventsCleanup extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create function email_events_of_deleted_emails() returns trigger language plpgsql as $$
      begin
        delete from email_events ev using deleted_emails d where ev.email_id = d.id;
        return null;
      end
      $$`);
    this.addSql(`
      create trigger emails_delete_events after delete on emails
        referencing old table as deleted_emails
        for each statement execute function email_events_of_deleted_emails()`);
    // Events already left behind by a deleted organization.
    this.addSql('delete from email_events ev where not exists (select 1 from emails e where e.id = ev.email_id)');
  }

  override async down(): Promise<void> {
    this.addSql('drop trigger emails_delete_events on emails');
    this.addSql('drop function email_events_of_deleted_emails()');
  }
}

import { Migration } from '@mikro-orm/migrations';

/**
 * The foreign key `emails.organization_id → organizations` ran a check for every accepted
 * email (a `select … for key share` on the organization row, at commit): about a sixth of
 * PostgreSQL's CPU per email on the hot insert (bench/ingest-sql.ts). Its one use, removing
 * an organization's emails with the organization, becomes a statement-level trigger on
 * `organizations`, which costs nothing on the insert path (the same shape as
 * 20261123070000-email-events-cleanup, which then removes their events). Every email is
 * written by the API or a worker for an organization it has just read; an email written
 * while its organization is deleted at that moment is the only one the trigger can miss.
 */
export class Migration20261125015000EmailsOrganizationTrigger extends Migration {
  override async up(): Promise<void> {
    this.addSql('alter table emails drop constraint emails_organization_id_fkey');
    this.addSql(`
      create function emails_of_deleted_organizations() returns trigger language plpgsql as $$
      begin
        delete from emails e using deleted_organizations o where e.organization_id = o.id;
        return null;
      end
      $$`);
    this.addSql(`
      create trigger organizations_delete_emails after delete on organizations
        referencing old table as deleted_organizations
        for each statement execute function emails_of_deleted_organizations()`);
  }

  override async down(): Promise<void> {
    this.addSql('drop trigger organizations_delete_emails on organizations');
    this.addSql('drop function emails_of_deleted_organizations()');
    this.addSql('delete from emails e where not exists (select 1 from organizations o where o.id = e.organization_id)');
    this.addSql(
      'alter table emails add constraint emails_organization_id_fkey foreign key (organization_id) references organizations (id) on delete cascade deferrable initially deferred',
    );
  }
}

import { Migration } from '@mikro-orm/migrations';

export class Migration20261125080000Users extends Migration {
  override async up(): Promise<void> {
    // The people of an organization who sign in to the dashboard (docs/dashboard.md). An
    // address signs in to one organization: it is unique across the service.
    this.addSql(`
      create table users (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade,
        email text not null,
        password_hash text not null,
        created_at timestamptz(3) not null default now()
      )`);
    this.addSql('create unique index users_email_uq on users (email)');
    this.addSql('create index users_organization_idx on users (organization_id, id)');
    // The dashboard's recipient search stays an index range with 1,000,000 emails. Migrations
    // run in one transaction, so this build holds off writes to emails while it runs; with a
    // large table, create the same index CONCURRENTLY before upgrading and this is a no-op.
    this.addSql(`create index if not exists emails_api_recipient_idx on emails (organization_id, lower(to_address), id) where source = 'api'`);
  }

  override async down(): Promise<void> {
    this.addSql('drop index if exists emails_api_recipient_idx');
    this.addSql('drop table if exists users');
  }
}

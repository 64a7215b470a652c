import { Migration } from '@mikro-orm/migrations';

export class Migration20261123030000Domains extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create table domains (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        domain varchar(253) not null,
        region varchar(32) not null,
        status text not null check (status in ('NOT_STARTED', 'PENDING', 'VERIFIED', 'FAILED')),
        dkim_selector varchar(63) not null,
        dkim_private_key_sealed text not null,
        dns_records jsonb not null,
        mail_provider_records jsonb not null default '[]',
        message text,
        pending_since timestamptz(3),
        last_checked_at timestamptz(3),
        next_check_at timestamptz(3),
        verified_at timestamptz(3),
        created_at timestamptz(3) not null,
        updated_at timestamptz(3) not null,
        constraint domains_organization_domain_key unique (organization_id, domain)
      )`);
    // The re-check sweep reads only domains that are due.
    this.addSql(
      "create index domains_next_check_idx on domains (next_check_at) where status in ('PENDING', 'VERIFIED')",
    );
    this.addSql(`
      create table senders (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        domain_id text not null references domains (id) on delete cascade deferrable initially deferred,
        name varchar(100) not null,
        email varchar(320) not null,
        created_at timestamptz(3) not null,
        constraint senders_organization_email_key unique (organization_id, email)
      )`);
    this.addSql('create index senders_domain_idx on senders (domain_id)');
  }

  override async down(): Promise<void> {
    this.addSql('drop table senders');
    this.addSql('drop table domains');
  }
}

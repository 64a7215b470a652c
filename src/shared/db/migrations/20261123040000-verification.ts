import { Migration } from '@mikro-orm/migrations';

export class Migration20261123040000Verification extends Migration {
  override async up(): Promise<void> {
    // One row per verification call (docs/verification.md), owned by the organization.
    this.addSql(`
      create table email_verifications (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        email text not null,
        result text not null,
        accept boolean not null,
        status text not null,
        score smallint,
        suggestion text,
        traits jsonb not null,
        issues jsonb not null,
        retry_at timestamptz(3),
        cache_hit boolean not null,
        created_at timestamptz(3) not null
      )`);
    this.addSql('create index email_verifications_organization_idx on email_verifications (organization_id, id)');
    // Rule 10 of docs/verification.md: one counter per organization per UTC month, consumed atomically.
    this.addSql(`
      create table verification_quotas (
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        month date not null,
        used integer not null,
        primary key (organization_id, month)
      )`);
    // Trusted global history (docs/verification.md "History"): the service's own outcomes per
    // normalized address, across every organization. Written by delivery outcomes, read by the checks.
    this.addSql(`
      create table verification_history (
        email text primary key,
        domain text not null,
        hard_bounced_at timestamptz(3),
        complained_at timestamptz(3),
        suppressed boolean not null default false,
        mailbox_full_at timestamptz(3),
        mailbox_not_found_at timestamptz(3),
        proven_at timestamptz(3),
        updated_at timestamptz(3) not null
      )`);
    this.addSql(
      'create index verification_history_domain_bounced_idx on verification_history (domain) where hard_bounced_at is not null or mailbox_not_found_at is not null',
    );
  }

  override async down(): Promise<void> {
    this.addSql('drop table verification_history');
    this.addSql('drop table verification_quotas');
    this.addSql('drop table email_verifications');
  }
}

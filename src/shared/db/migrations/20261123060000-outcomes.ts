import { Migration } from '@mikro-orm/migrations';

export class Migration20261123060000Outcomes extends Migration {
  override async up(): Promise<void> {
    // Every tracking hit and provider event of an email (docs/outcomes.md). Rows are
    // inserted in batches by the tracking recorder and by the provider webhook.
    // The hottest insert of the service (every pixel and click): no serial key and no
    // foreign keys, whose checks would cost a lookup and a row lock per hit. The writers join
    // `emails` (a hit of an unknown email is not recorded) and copy its organization.
    this.addSql(`
      create table email_events (
        email_id text collate "C" not null,
        organization_id text collate "C" not null,
        type text not null check (type in ('open', 'click', 'delivered', 'bounced', 'complained')),
        occurred_at timestamptz(3) not null default now(),
        ip text,
        user_agent text,
        url text,
        details jsonb
      )`);
    this.addSql('create index email_events_email_idx on email_events (email_id, occurred_at)');
    // A provider event is recorded once per email and type: a replayed webhook inserts nothing.
    this.addSql(`create unique index email_events_provider_uq on email_events (email_id, type) where type in ('delivered', 'bounced', 'complained')`);

    // The organization's suppression list: hard bounces and complaints. Sends to an address
    // on it are accepted and then failed with reason "suppressed", never handed over.
    this.addSql(`
      create table suppressions (
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        address text not null,
        reason text not null check (reason in ('hard_bounce', 'complaint')),
        email_id text,
        created_at timestamptz(3) not null default now(),
        primary key (organization_id, address)
      )`);
  }

  override async down(): Promise<void> {
    this.addSql('drop table suppressions');
    this.addSql('drop table email_events');
  }
}

import { Migration } from '@mikro-orm/migrations';

export class Migration20261123020000Audience extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create table subscribers (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        email text not null,
        name text,
        phone text,
        status text not null check (status in ('PENDING_CONFIRMATION', 'SUBSCRIBED', 'UNSUBSCRIBED', 'BOUNCED', 'BANNED', 'COMPLAINED', 'TRANSACTIONAL')),
        fields jsonb not null default '{}'::jsonb,
        revenue bigint not null default 0,
        signup_ip text,
        signup_country char(2),
        confirmed_at timestamptz(3),
        confirm_ip text,
        confirm_user_agent text,
        unsubscribed_at timestamptz(3),
        created_at timestamptz(3) not null,
        updated_at timestamptz(3) not null
      )`);
    // One subscriber per address in an organization; addresses are stored lower-cased.
    this.addSql('create unique index subscribers_organization_email_uq on subscribers (organization_id, email)');
    // Cursor lists: newest first by id (ULIDs sort by creation time).
    this.addSql('create index subscribers_organization_id_idx on subscribers (organization_id, id desc)');
    // Campaign recipient filters on custom fields (@> for eq/neq, ? for exists/not_exists).
    this.addSql('create index subscribers_fields_gin on subscribers using gin (fields)');

    this.addSql(`
      create table tags (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        name varchar(100) not null,
        created_at timestamptz(3) not null,
        updated_at timestamptz(3) not null
      )`);
    // Names are unique per organization regardless of case: "VIP" and "vip" are one tag.
    this.addSql('create unique index tags_organization_name_uq on tags (organization_id, lower(name))');

    this.addSql(`
      create table subscriber_tags (
        subscriber_id text not null references subscribers (id) on delete cascade deferrable initially deferred,
        tag_id text not null references tags (id) on delete cascade deferrable initially deferred,
        created_at timestamptz(3) not null,
        primary key (subscriber_id, tag_id)
      )`);
    this.addSql('create index subscriber_tags_tag_idx on subscriber_tags (tag_id, subscriber_id)');

    this.addSql(`
      create table subscriber_events (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        subscriber_id text not null references subscribers (id) on delete cascade deferrable initially deferred,
        event_type text not null,
        data jsonb not null default '{}'::jsonb,
        created_at timestamptz(3) not null
      )`);
    this.addSql('create index subscriber_events_subscriber_idx on subscriber_events (subscriber_id, id desc)');
  }

  override async down(): Promise<void> {
    this.addSql('drop table subscriber_events');
    this.addSql('drop table subscriber_tags');
    this.addSql('drop table tags');
    this.addSql('drop table subscribers');
  }
}

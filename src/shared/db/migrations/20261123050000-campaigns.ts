import { Migration } from '@mikro-orm/migrations';

export class Migration20261123050000Campaigns extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create table campaigns (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        name text not null,
        subject text not null default '',
        preview text,
        status text not null default 'DRAFT' check (status in ('DRAFT', 'ARCHIVED', 'SCHEDULED', 'SENDING', 'SENT', 'FAILED')),
        content_type text not null default 'MARKDOWN' check (content_type in ('MARKDOWN', 'MAILY', 'PLATE')),
        mail_format text,
        content jsonb,
        recipient_filters jsonb not null default '[]',
        recipient_count integer,
        emails_sent_count integer not null default 0,
        emails_opened_count integer not null default 0,
        emails_clicked_count integer not null default 0,
        scheduled_at timestamptz(3),
        send_at timestamptz(3),
        timezone text,
        sender_id text,
        reply_to text,
        fanout_cursor text,
        fanout_done boolean not null default false,
        finished_at timestamptz(3),
        created_at timestamptz(3) not null,
        updated_at timestamptz(3) not null
      )`);
    this.addSql(`create index campaigns_org_idx on campaigns (organization_id, id desc)`);
    this.addSql(`create index campaigns_active_idx on campaigns (status) where status in ('SCHEDULED', 'SENDING')`);
    // One email per (campaign, subscriber), never two (docs/campaigns.md "Fan-out"): the fan-out
    // inserts with "on conflict do nothing", so a resumed or repeated page writes nothing twice.
    this.addSql(`create unique index emails_campaign_subscriber_uq on emails (campaign_id, subscriber_id) where source = 'campaign'`);
    // The completion check: "is any email of this campaign still waiting to be handed over?"
    this.addSql(`create index emails_campaign_pending_idx on emails (campaign_id) where source = 'campaign' and status in ('queued', 'sending')`);
  }

  override async down(): Promise<void> {
    this.addSql('drop index if exists emails_campaign_pending_idx');
    this.addSql('drop index if exists emails_campaign_subscriber_uq');
    this.addSql('drop table if exists campaigns');
  }
}

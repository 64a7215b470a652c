import { Migration } from '@mikro-orm/migrations';

export class Migration20261123010000Emails extends Migration {
  override async up(): Promise<void> {
    // `id` sorts in the "C" collation: ids are prefixed ULIDs, so byte order is creation
    // order, which the cursor list relies on.
    this.addSql(`
      create table emails (
        id text collate "C" primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        source text not null default 'api' check (source in ('api', 'campaign', 'test')),
        campaign_id text,
        subscriber_id text,
        status text not null default 'queued' check (status in ('queued', 'sending', 'sent', 'failed')),
        delivery_status text check (delivery_status in ('delivered', 'bounced', 'complained')),
        from_address text not null,
        to_address text not null,
        cc jsonb,
        bcc jsonb,
        reply_to jsonb,
        subject text not null,
        content_kind text not null check (content_kind in ('html', 'markdown', 'tiptap')),
        content text not null,
        preview text,
        html text,
        text text,
        tags jsonb not null default '[]',
        headers jsonb not null default '{}',
        message_id text,
        failure_reason text,
        attempts integer not null default 0,
        claimed_at timestamptz(3),
        sent_at timestamptz(3),
        first_opened_at timestamptz(3),
        first_clicked_at timestamptz(3),
        created_at timestamptz(3) not null default now(),
        updated_at timestamptz(3) not null default now()
      )`);
    // The API list (docs/emails.md): one organization's API sends, newest first.
    this.addSql(`create index emails_api_list_idx on emails (organization_id, id) where source = 'api'`);
    // The reconciler's keyset scan: only rows not yet handed over are indexed, so it stays small.
    this.addSql(`create index emails_pending_idx on emails (id) where status in ('queued', 'sending')`);
    // Provider delivery events find their email by Message-ID.
    this.addSql(`create index emails_message_id_idx on emails (message_id) where message_id is not null`);
    this.addSql(`create index emails_campaign_idx on emails (campaign_id) where campaign_id is not null`);

    // Idempotency-Key (docs/emails.md "Idempotency-Key"): one row a key per organization, kept 24 h.
    this.addSql(`
      create table email_idempotency_keys (
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        idempotency_key text not null,
        request_hash char(64) not null,
        email_ids text[] not null,
        created_at timestamptz(3) not null default now(),
        primary key (organization_id, idempotency_key)
      )`);
    this.addSql('create index email_idempotency_keys_created_idx on email_idempotency_keys (created_at)');
  }

  override async down(): Promise<void> {
    this.addSql('drop table email_idempotency_keys');
    this.addSql('drop table emails');
  }
}

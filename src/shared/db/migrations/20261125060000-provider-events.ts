import { Migration } from '@mikro-orm/migrations';

/**
 * The providers' own webhooks (docs/outcomes.md, "Provider webhooks"):
 * - `emails.provider_message_id`: the id a relay gave the message in its `250` answer
 *   (Amazon SES, SendGrid, Postmark replace or add their own id); their events are matched
 *   by it when they do not carry the Message-ID mailroom set. Null for most rows, so the
 *   partial index costs nothing on the insert of an email.
 * - `email_events.type` gains `delivery_delayed`; like the other provider events it is
 *   recorded once per email (a replayed or repeated delay notice has one effect).
 */
export class Migration20261125060000ProviderEvents extends Migration {
  override async up(): Promise<void> {
    this.addSql('alter table emails add column provider_message_id text');
    this.addSql('create index emails_provider_message_id_idx on emails (provider_message_id) where provider_message_id is not null');
    this.addSql('alter table email_events drop constraint email_events_type_check');
    this.addSql(`alter table email_events add constraint email_events_type_check check (type in ('open', 'click', 'delivered', 'bounced', 'complained', 'delivery_delayed'))`);
    this.addSql('drop index email_events_provider_uq');
    this.addSql(`create unique index email_events_provider_uq on email_events (email_id, type) where type in ('delivered', 'bounced', 'complained', 'delivery_delayed')`);
  }

  override async down(): Promise<void> {
    this.addSql(`delete from email_events where type = 'delivery_delayed'`);
    this.addSql('drop index email_events_provider_uq');
    this.addSql(`create unique index email_events_provider_uq on email_events (email_id, type) where type in ('delivered', 'bounced', 'complained')`);
    this.addSql('alter table email_events drop constraint email_events_type_check');
    this.addSql(`alter table email_events add constraint email_events_type_check check (type in ('open', 'click', 'delivered', 'bounced', 'complained'))`);
    this.addSql('drop index emails_provider_message_id_idx');
    this.addSql('alter table emails drop column provider_message_id');
  }
}

import { Migration } from '@mikro-orm/migrations';

/**
 * A bounce or complaint about a copy recipient (`cc`, `bcc`) of an email is recorded as an
 * email event whose `details.recipient` names that address (docs/outcomes.md, "Copy
 * recipients"). Provider events stay unique per email and type, now per recipient too: an
 * event of the `to` (no `details.recipient`) and one of each copy can all be recorded once.
 */
export class Migration20261125121000CopyRecipientEvents extends Migration {
  override async up(): Promise<void> {
    this.addSql('drop index email_events_provider_uq');
    this.addSql(
      `create unique index email_events_provider_uq on email_events (email_id, type, (coalesce(details ->> 'recipient', ''))) where type in ('delivered', 'bounced', 'complained', 'delivery_delayed')`,
    );
  }

  override async down(): Promise<void> {
    this.addSql(`delete from email_events where type in ('delivered', 'bounced', 'complained', 'delivery_delayed') and details ->> 'recipient' is not null`);
    this.addSql('drop index email_events_provider_uq');
    this.addSql(`create unique index email_events_provider_uq on email_events (email_id, type) where type in ('delivered', 'bounced', 'complained', 'delivery_delayed')`);
  }
}

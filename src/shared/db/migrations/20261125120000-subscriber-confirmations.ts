import { Migration } from '@mikro-orm/migrations';

export class Migration20261125120000SubscriberConfirmations extends Migration {
  override async up(): Promise<void> {
    // Double opt-in's outbox: a row per subscriber whose confirmation email is owed, written
    // in the transaction that makes it PENDING_CONFIRMATION and deleted by the job that
    // hands the email to the send pipeline. A row older than a grace period had its job
    // lost (Redis failed after the commit): the subscribers reconciler enqueues it again.
    this.addSql(`
      create table subscriber_confirmations (
        subscriber_id text primary key references subscribers (id) on delete cascade deferrable initially deferred,
        created_at timestamptz(3) not null
      )`);
    this.addSql('create index subscriber_confirmations_created_idx on subscriber_confirmations (created_at)');
  }

  override async down(): Promise<void> {
    this.addSql('drop table if exists subscriber_confirmations');
  }
}

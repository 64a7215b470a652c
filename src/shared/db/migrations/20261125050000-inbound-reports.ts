import { Migration } from '@mikro-orm/migrations';

export class Migration20261125050000InboundReports extends Migration {
  override async up(): Promise<void> {
    // Bounce and complaint reports received by the inbound SMTP listener (docs/outcomes.md):
    // stored as received, one row per return-path recipient, then read by a worker. No
    // foreign key to `emails`: a report may name an email that has since been deleted.
    this.addSql(`
      create table inbound_reports (
        id text primary key,
        email_id text not null,
        mail_from text not null,
        rcpt_to text not null,
        size integer not null,
        raw bytea not null,
        status text not null default 'received' check (status in ('received', 'applied', 'ignored')),
        outcome jsonb,
        received_at timestamptz(3) not null,
        processed_at timestamptz(3)
      )`);
    // The reconciler's scan (reports whose job Redis lost) and the retention purge.
    this.addSql(`create index inbound_reports_received_idx on inbound_reports (received_at) where status = 'received'`);
    this.addSql(`create index inbound_reports_processed_idx on inbound_reports (processed_at) where status <> 'received'`);
  }

  override async down(): Promise<void> {
    this.addSql('drop table if exists inbound_reports');
  }
}

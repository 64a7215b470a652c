import { Migration } from '@mikro-orm/migrations';

/**
 * The recipient search's index under its own name, for a database that ran the first form of
 * 20261125220000 (which rebuilt `emails_api_recipient_idx` on the bare address in place): a
 * migration already applied is never run again, so the rename comes as a migration of its own.
 * On a database that ran the later form it changes nothing.
 */
export class Migration20261126010000EmailsRecipientAddressIndex extends Migration {
  override async up(): Promise<void> {
    this.addSql(`create index if not exists emails_api_recipient_address_idx on emails (organization_id, email_bare_address(to_address), id) where source = 'api'`);
    this.addSql('drop index if exists emails_api_recipient_idx');
  }

  override async down(): Promise<void> {
    // 20261125220000's down puts back the index before it.
  }
}

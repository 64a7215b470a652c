import { Migration } from '@mikro-orm/migrations';

export class Migration20261123080000CampaignTemplates extends Migration {
  override async up(): Promise<void> {
    // A campaign's message rendered once, placeholders left in (docs/campaigns.md): the
    // fan-out writes it when it starts; its email rows (content kind `campaign`) carry no
    // body and are personalised from it when the send path claims them.
    this.addSql(`
      create table campaign_templates (
        campaign_id text primary key references campaigns (id) on delete cascade deferrable initially deferred,
        subject text not null,
        html text not null,
        text text not null,
        created_at timestamptz(3) not null default now()
      )`);
    // Wider than the check it replaces, so the rows already there satisfy it: not re-checked.
    this.addSql(`alter table emails drop constraint emails_content_kind_check`);
    this.addSql(`alter table emails add constraint emails_content_kind_check check (content_kind in ('html', 'markdown', 'tiptap', 'campaign')) not valid`);
  }

  override async down(): Promise<void> {
    this.addSql(`alter table emails drop constraint emails_content_kind_check`);
    this.addSql(`alter table emails add constraint emails_content_kind_check check (content_kind in ('html', 'markdown', 'tiptap')) not valid`);
    this.addSql('drop table if exists campaign_templates');
  }
}

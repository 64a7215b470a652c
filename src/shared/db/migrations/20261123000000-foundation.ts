import { Migration } from '@mikro-orm/migrations';

export class Migration20261123000000Foundation extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create table organizations (
        id text primary key,
        name text not null,
        double_opt_in boolean not null default false,
        verify_quota integer not null,
        track_opens boolean not null default true,
        track_clicks boolean not null default true,
        created_at timestamptz(3) not null,
        updated_at timestamptz(3) not null
      )`);
    this.addSql(`
      create table api_tokens (
        id text primary key,
        organization_id text not null references organizations (id) on delete cascade deferrable initially deferred,
        name varchar(100) not null,
        token_hash char(64) not null unique,
        secret_sealed text not null,
        last4 char(4) not null,
        permissions jsonb not null,
        created_at timestamptz(3) not null
      )`);
    this.addSql('create index api_tokens_organization_name_idx on api_tokens (organization_id, name)');
  }

  override async down(): Promise<void> {
    this.addSql('drop table api_tokens');
    this.addSql('drop table organizations');
  }
}

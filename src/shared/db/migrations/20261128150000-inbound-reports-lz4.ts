import { Migration } from '@mikro-orm/migrations';

export class Migration20261128150000InboundReportsLz4 extends Migration {
  override async up(): Promise<void> {
    // A stored report (a few KB of MIME) is compressed as it is written, on the listener's path
    // before its 250, and read back by the worker: 20,000 Postfix-style DSNs were inserted in
    // 139 ms with lz4 against 487 ms with pglz, to about the same size (bench/README.md, 2026-11-28).
    // Only where the server has it (PostgreSQL 14 and later built with lz4, as Debian's and the
    // official images are); elsewhere pglz stays. Rows already written keep their compression.
    this.addSql(`
      do $$
      begin
        if exists (select 1 from pg_settings where name = 'default_toast_compression' and 'lz4' = any(enumvals)) then
          alter table inbound_reports alter column raw set compression lz4;
        end if;
      end
      $$`);
  }

  override async down(): Promise<void> {
    this.addSql(`
      do $$
      begin
        if exists (select 1 from pg_settings where name = 'default_toast_compression') then
          alter table inbound_reports alter column raw set compression default;
        end if;
      end
      $$`);
  }
}

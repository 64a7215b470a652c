import { Migration } from '@mikro-orm/migrations';

/**
 * `email_bare_address(text)`: the bare, lower-cased address of a column holding `addr` or
 * `Name <addr>`. The send path's claim, the outcome recorder and the bounce reader each
 * compared recipients with the suppression list by this expression, which one module
 * exported to the others as SQL text; a function of the schema is one definition that every
 * data-access module calls. Immutable and a plain `select`, so PostgreSQL inlines it.
 */
export class Migration20261125110000EmailBareAddress extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create function email_bare_address(value text) returns text
        language sql immutable parallel safe
        as $$ select lower(trim(coalesce(substring(value from '<([^<>]+)>\\s*$'), value))) $$`);
  }

  override async down(): Promise<void> {
    this.addSql('drop function email_bare_address(text)');
  }
}

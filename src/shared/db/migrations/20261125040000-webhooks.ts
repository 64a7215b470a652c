import { Migration } from '@mikro-orm/migrations';

/**
 * Webhooks to the customer's endpoints (docs/webhooks.md).
 *
 * `webhook_endpoints`: one row per URL an organization registered; the signing secret is
 * stored sealed (AES-256-GCM under SECRET_KEY), never in clear.
 *
 * `webhook_messages`: the transactional outbox and the delivery log at once. A row is one
 * (event, endpoint) pair, written in the same transaction as the change it reports; its id
 * (`msg_…`) is the `webhook-id` header of every attempt. The worker claims due `pending`
 * rows of one endpoint (a lease in `locked_until`), posts them, and writes the outcome back.
 */
export class Migration20261125040000Webhooks extends Migration {
  override async up(): Promise<void> {
    this.addSql(`
      create table webhook_endpoints (
        id text collate "C" primary key,
        organization_id text not null references organizations (id) on delete cascade,
        url text not null,
        events text[] not null,
        description text,
        enabled boolean not null default true,
        disabled_reason text,
        secret_sealed text not null,
        -- Since when every delivery to this endpoint has failed (null after any success).
        failing_since timestamptz(3),
        created_at timestamptz(3) not null default now(),
        updated_at timestamptz(3) not null default now()
      )`);
    this.addSql(`create index webhook_endpoints_org_idx on webhook_endpoints (organization_id, id)`);

    this.addSql(`
      create table webhook_messages (
        id text collate "C" primary key,
        endpoint_id text not null references webhook_endpoints (id) on delete cascade,
        organization_id text not null,
        type text not null,
        -- The body as posted: { type, created_at, data }.
        payload jsonb not null,
        status text not null default 'pending' check (status in ('pending', 'succeeded', 'failed')),
        attempts integer not null default 0,
        last_status_code integer,
        last_error text,
        next_attempt_at timestamptz(3),
        -- A claimed row is not claimed again before this time (the claimer's lease).
        locked_until timestamptz(3),
        created_at timestamptz(3) not null default now(),
        updated_at timestamptz(3) not null default now()
      )`);
    // The deliveries list of one endpoint, newest first (keyset on the id).
    this.addSql(`create index webhook_messages_endpoint_idx on webhook_messages (endpoint_id, id)`);
    // The dispatcher's scan and the worker's claim: only rows still to deliver are indexed.
    this.addSql(`create index webhook_messages_due_idx on webhook_messages (endpoint_id, next_attempt_at) where status = 'pending'`);
    // The purge of old deliveries.
    this.addSql(`create index webhook_messages_created_idx on webhook_messages (created_at)`);

    // Message ids made by the statement that writes the outbox rows (one per endpoint), in
    // the shape of every other id (docs/foundation.md "Identifiers, time and lists"): 'msg_' + a
    // lower-case ULID (48-bit time in milliseconds, 80 random bits, Crockford base32).
    this.addSql(`
      create function webhook_message_id() returns text language plpgsql volatile as $$
      declare
        alphabet constant text := '0123456789abcdefghjkmnpqrstvwxyz';
        ms bigint := floor(extract(epoch from clock_timestamp()) * 1000);
        bytes bytea := decode(replace(gen_random_uuid()::text, '-', ''), 'hex');
        out text := 'msg_';
      begin
        for i in reverse 9..0 loop
          out := out || substr(alphabet, ((ms >> (5 * i)) & 31)::int + 1, 1);
        end loop;
        for i in 0..15 loop
          out := out || substr(alphabet, (get_byte(bytes, i) & 31) + 1, 1);
        end loop;
        return out;
      end
      $$`);
  }

  override async down(): Promise<void> {
    this.addSql('drop function webhook_message_id()');
    this.addSql('drop table webhook_messages');
    this.addSql('drop table webhook_endpoints');
  }
}

import type { Connection } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';

/**
 * The data access of verification: the monthly quota (`verification_quotas`), the global
 * history (`verification_history`) and the stored results (`email_verifications`). The
 * batched statements of store.ts run on the connection, outside any transaction.
 */

type Execute = Pick<EntityManager, 'execute'>;
type Conn = Pick<Connection, 'execute'>;
export type Row = Record<string, unknown>;

// ---------------------------------------------------------------- history

export type HistoryColumn = 'hard_bounced_at' | 'complained_at' | 'mailbox_full_at' | 'mailbox_not_found_at' | 'proven_at' | 'suppressed';

/**
 * One idempotent upsert of an address's history: a time column keeps the latest time, and
 * `suppressed` takes `value`. Through the EntityManager, so that inside a transaction the
 * write joins it.
 */
export async function upsertHistory(em: Execute, h: { email: string; domain: string; column: HistoryColumn; at: Date; value?: boolean }): Promise<void> {
  const { column } = h;
  const set = column === 'suppressed' ? '?' : `greatest(verification_history.${column}, ?::timestamptz)`;
  const bound = column === 'suppressed' ? (h.value ?? true) : h.at;
  await em.execute(
    `insert into verification_history (email, domain, ${column}, updated_at) values (?, ?, ?, ?)
     on conflict (email) do update set ${column} = ${set}, updated_at = excluded.updated_at`,
    [h.email, h.domain, bound, h.at, bound],
    'run',
  );
}

// ---------------------------------------------------------------- quota

/** The organization's quota and this month's use (null: none yet); undefined when no organization. */
export async function selectQuota(em: Execute, organizationId: string, month: string): Promise<{ limit: number; used: number | null } | undefined> {
  const rows = await em.execute<{ limit: number; used: number | null }[]>(
    `select o.verify_quota as limit, q.used from organizations o
       left join verification_quotas q on q.organization_id = o.id and q.month = ?::date
      where o.id = ?`,
    [month, organizationId],
    'all',
  );
  return rows[0];
}

const ASYNC_COMMIT = `select set_config('synchronous_commit', 'off', true)`;

/** Creates the organization's quota row of `month` when missing. */
export async function ensureQuotaRow(conn: Conn, organizationId: string, month: string): Promise<void> {
  await conn.execute<Row[]>(
    `insert into verification_quotas (organization_id, month, used) select id, ?::date, 0 from organizations where id = ?
             on conflict (organization_id, month) do nothing`,
    [month, organizationId],
  );
}

/**
 * Atomic: the row is locked (FOR UPDATE) and read at its latest version, then takes as many
 * units as are left, up to `units`. `used` never exceeds the limit, and never goes down
 * when the limit was lowered below it. The same statement reads the history of `lookups`
 * (and, per domain, up to `recurringBounces` other addresses that bounced as unknown).
 * Commits with synchronous_commit off (store.ts says why).
 */
export async function takeQuotaAndReadHistory(
  conn: Conn,
  q: { organizationId: string; month: string; units: number; lookups: Array<{ i: number; email: string | null; domain: string | null }>; recurringBounces: number },
): Promise<Row | undefined> {
  const rows = await conn.execute<Row[]>(
    `with ac as (${ASYNC_COMMIT}),
           cur as (
             select v.used, o.verify_quota as lim from verification_quotas v join organizations o on o.id = v.organization_id
             where v.organization_id = ? and v.month = ?::date for update of v
           ),
           upd as (
             update verification_quotas q set used = greatest(q.used, least(q.used + ?, cur.lim))
             from cur, ac
             where q.organization_id = ? and q.month = ?::date
             returning cur.used as old_used, q.used as new_used, cur.lim
           ),
           hist as (
             select e.i, h.email as history_email, h.hard_bounced_at, h.complained_at, h.suppressed, h.mailbox_full_at,
                    h.mailbox_not_found_at, h.proven_at, c.proven_at as catch_all_at,
                    (select count(*) from (
                       select 1 from verification_history b
                       where b.domain = e.domain and b.email <> e.email and b.email not like '*@%'
                         and (b.hard_bounced_at is not null or b.mailbox_not_found_at is not null)
                       limit ${q.recurringBounces}) d) as domain_bad
             from json_to_recordset(?::json) as e(i int, email text, domain text)
             left join verification_history h on h.email = e.email
             left join verification_history c on c.email = '*@' || e.domain
           )
           select upd.old_used, upd.new_used, upd.lim, (select json_agg(hist) from hist) as history
           from upd`,
    [q.organizationId, q.month, q.units, q.organizationId, q.month, JSON.stringify(q.lookups)],
  );
  return rows[0];
}

// ---------------------------------------------------------------- results

/** One multi-row insert of results, given as email_verifications rows (snake_case keys). */
export async function insertVerifications(conn: Conn, rows: ReadonlyArray<Record<string, unknown>>): Promise<void> {
  await conn.execute<Row[]>(
    `with ac as (${ASYNC_COMMIT})
       insert into email_verifications (id, organization_id, email, result, accept, status, score, suggestion, traits, issues, retry_at, cache_hit, created_at)
       select r.id, r.organization_id, r.email, r.result, r.accept, r.status, r.score, r.suggestion, r.traits, r.issues, r.retry_at, r.cache_hit, r.created_at
       from ac, json_populate_recordset(null::email_verifications, ?::json) r`,
    [JSON.stringify(rows)],
  );
}

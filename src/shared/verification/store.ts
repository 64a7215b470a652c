import type { EntityManager } from '@mikro-orm/postgresql';
import { domainRowKey, RECURRING_BOUNCES, type HistoryRow } from './history.js';

export interface QuotaState {
  limit: number;
  used: number;
  /** This call took one unit of the month's quota. */
  consumed: boolean;
}

const toDate = (v: unknown): Date | null => (v === null || v === undefined ? null : new Date(v as string));

/**
 * One round trip: take one unit of the organization's quota for `month` if any is left
 * (a conditional upsert, so concurrent calls never overrun: `used` never exceeds the
 * limit), and read the global history of the address and its domain. The history is
 * read in every case and ignored by the caller when the quota is exhausted (spec 3.5).
 */
export async function consumeQuotaAndReadHistory(
  em: EntityManager,
  input: { organizationId: string; month: string; email: string; domain: string },
): Promise<{ quota: QuotaState; history: HistoryRow | null }> {
  const rows = await em.getConnection().execute<Array<Record<string, unknown>>>(
    `with org as (select verify_quota as quota_limit from organizations where id = ?),
     consumed as (
       insert into verification_quotas as q (organization_id, month, used)
       select ?, ?::date, 1 from org where org.quota_limit > 0
       on conflict (organization_id, month) do update set used = q.used + 1
         where q.used < (select quota_limit from org)
       returning q.used
     )
     select (select quota_limit from org) as quota_limit,
            (select used from consumed) as consumed_used,
            (select used from verification_quotas where organization_id = ? and month = ?::date) as previous_used,
            h.email as history_email, h.hard_bounced_at, h.complained_at, h.suppressed, h.mailbox_full_at,
            h.mailbox_not_found_at, h.proven_at,
            c.proven_at as catch_all_at,
            (select count(*) from (
               select 1 from verification_history b
               where b.domain = ? and b.email <> ? and b.email not like '*@%'
                 and (b.hard_bounced_at is not null or b.mailbox_not_found_at is not null)
               limit ${RECURRING_BOUNCES}) d) as domain_bad
     from (select 1) one
     left join verification_history h on h.email = ?
     left join verification_history c on c.email = ?`,
    [
      input.organizationId,
      input.organizationId,
      input.month,
      input.organizationId,
      input.month,
      input.domain,
      input.email,
      input.email,
      domainRowKey(input.domain),
    ],
  );
  const row = rows[0]!;
  const limit = Number(row.quota_limit ?? 0);
  const consumedUsed = row.consumed_used === null || row.consumed_used === undefined ? null : Number(row.consumed_used);
  const quota: QuotaState =
    consumedUsed !== null
      ? { limit, used: consumedUsed, consumed: true }
      : { limit, used: Number(row.previous_used ?? 0), consumed: false };
  const catchAll = row.catch_all_at !== null && row.catch_all_at !== undefined;
  const domainBad = Number(row.domain_bad ?? 0);
  const history: HistoryRow | null =
    row.history_email || catchAll || domainBad > 0
      ? {
          hardBouncedAt: toDate(row.hard_bounced_at),
          complainedAt: toDate(row.complained_at),
          suppressed: row.suppressed === true,
          mailboxFullAt: toDate(row.mailbox_full_at),
          mailboxNotFoundAt: toDate(row.mailbox_not_found_at),
          provenAt: toDate(row.proven_at),
          catchAll,
          domainBadAddresses: domainBad,
        }
      : null;
  return { quota, history };
}

export interface StoredVerification {
  id: string;
  organizationId: string;
  email: string;
  result: string;
  accept: boolean;
  status: string;
  score: number | null;
  suggestion: string | null;
  traits: object;
  issues: object[];
  retryAt: Date | null;
  cacheHit: boolean;
  createdAt: Date;
}

export async function insertVerification(em: EntityManager, v: StoredVerification): Promise<void> {
  await em.getConnection().execute(
    `insert into email_verifications (id, organization_id, email, result, accept, status, score, suggestion, traits, issues, retry_at, cache_hit, created_at)
     values (?, ?, ?, ?, ?, ?, ?, ?, ?::jsonb, ?::jsonb, ?, ?, ?)`,
    [
      v.id,
      v.organizationId,
      v.email,
      v.result,
      v.accept,
      v.status,
      v.score,
      v.suggestion,
      JSON.stringify(v.traits),
      JSON.stringify(v.issues),
      v.retryAt,
      v.cacheHit,
      v.createdAt,
    ],
  );
}

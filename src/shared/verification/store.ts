import type { Connection } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';
import { MicroBatcher } from './batcher.js';
import { RECURRING_BOUNCES, type HistoryRow } from './history.js';
// The catch-all row of a domain is `*@domain` (history.ts domainRowKey).

/**
 * PostgreSQL side of verification: the monthly quota, the history read and the stored
 * results. Calls arriving together are grouped (MicroBatcher): per batch, one statement
 * takes the quota and reads the history, one multi-row insert stores the results; the
 * organization's single quota row is locked once per batch rather than once per call.
 *
 * Every statement here commits with synchronous_commit off (for its own transaction only):
 * waiting for a WAL flush while holding the quota row's lock would cap verification at one
 * batch per fsync. A crash of PostgreSQL may forget the last fraction of a second of calls
 * (the quota then under-counts a little, never over-counts; a few stored results are
 * lost); nothing is ever corrupted.
 */
export interface QuotaState {
  limit: number;
  used: number;
  /** This call took one unit of the month's quota. */
  consumed: boolean;
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

type Row = Record<string, unknown>;
const ASYNC_COMMIT = `select set_config('synchronous_commit', 'off', true)`;
const toDate = (v: unknown): Date | null => (v === null || v === undefined ? null : new Date(v as string));

function toHistory(row: Row): HistoryRow {
  return {
    hardBouncedAt: toDate(row.hard_bounced_at),
    complainedAt: toDate(row.complained_at),
    suppressed: row.suppressed === true,
    mailboxFullAt: toDate(row.mailbox_full_at),
    mailboxNotFoundAt: toDate(row.mailbox_not_found_at),
    provenAt: toDate(row.proven_at),
    catchAll: row.catch_all_at !== null && row.catch_all_at !== undefined,
    domainBadAddresses: Number(row.domain_bad ?? 0),
  };
}
/** Quota rows known to exist, so the insert that creates them runs once a month per org. */
const ENSURED_MAX = 10_000;

export interface BeginInput {
  organizationId: string;
  month: string;
  /** The normalized address and its domain, when it is valid (else no history is read). */
  email: string | null;
  domain: string | null;
}

export interface BeginResult {
  quota: QuotaState;
  /** Read in the same statement; the caller ignores it when the quota is exhausted. */
  history: HistoryRow | null;
}

export class VerificationStore {
  private readonly ensured = new Set<string>();
  private readonly begins = new MicroBatcher<BeginInput, BeginResult>((items) => this.flushBegin(items));
  private readonly saves = new MicroBatcher<StoredVerification, void>((items) => this.flushSaves(items));

  constructor(private readonly connection: () => Connection) {}

  static forEntityManager(em: EntityManager): VerificationStore {
    return new VerificationStore(() => em.getConnection());
  }

  /**
   * Takes one unit of the organization's quota for `month` if any is left, and reads the
   * global history of the address, in one statement per batch and organization.
   */
  begin(input: BeginInput): Promise<BeginResult> {
    return this.begins.run(input);
  }

  save(row: StoredVerification): Promise<void> {
    return this.saves.run(row);
  }

  private async execute(sql: string, params: unknown[]): Promise<Row[]> {
    return this.connection().execute<Row[]>(sql, params);
  }

  private async flushBegin(items: BeginInput[]): Promise<BeginResult[]> {
    const groups = new Map<string, number[]>();
    items.forEach((item, i) => {
      const key = `${item.organizationId}|${item.month}`;
      groups.set(key, [...(groups.get(key) ?? []), i]);
    });
    const out: BeginResult[] = new Array(items.length);
    await Promise.all(
      [...groups.entries()].map(async ([key, indexes]) => {
        const [organizationId, month] = key.split('|') as [string, string];
        if (!this.ensured.has(key)) {
          await this.execute(
            `insert into verification_quotas (organization_id, month, used) select id, ?::date, 0 from organizations where id = ?
             on conflict (organization_id, month) do nothing`,
            [month, organizationId],
          );
          if (this.ensured.size >= ENSURED_MAX) this.ensured.clear();
          this.ensured.add(key);
        }
        const lookups = indexes.filter((i) => items[i]!.email).map((i) => ({ i, email: items[i]!.email, domain: items[i]!.domain }));
        // Atomic: the row is locked (FOR UPDATE) and read at its latest version, then takes
        // as many units as are left, up to the batch size. `used` never exceeds the limit,
        // and never goes down when the limit was lowered below it.
        const rows = await this.execute(
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
                       limit ${RECURRING_BOUNCES}) d) as domain_bad
             from json_to_recordset(?::json) as e(i int, email text, domain text)
             left join verification_history h on h.email = e.email
             left join verification_history c on c.email = '*@' || e.domain
           )
           select upd.old_used, upd.new_used, upd.lim, (select json_agg(hist) from hist) as history
           from upd`,
          [organizationId, month, indexes.length, organizationId, month, JSON.stringify(lookups)],
        );
        const row = rows[0];
        const limit = Number(row?.lim ?? 0);
        const oldUsed = Number(row?.old_used ?? 0);
        const newUsed = Number(row?.new_used ?? 0);
        const granted = Math.max(0, newUsed - oldUsed);
        const histories = new Map<number, HistoryRow>();
        for (const h of (row?.history ?? []) as Row[]) {
          const found = toHistory(h);
          if (h.history_email || found.catchAll || found.domainBadAddresses > 0) histories.set(Number(h.i), found);
        }
        indexes.forEach((index, n) => {
          const quota: QuotaState =
            n < granted ? { limit, used: oldUsed + n + 1, consumed: true } : { limit, used: newUsed, consumed: false };
          out[index] = { quota, history: histories.get(index) ?? null };
        });
      }),
    );
    return out;
  }

  private async flushSaves(items: StoredVerification[]): Promise<void[]> {
    await this.execute(
      `with ac as (${ASYNC_COMMIT})
       insert into email_verifications (id, organization_id, email, result, accept, status, score, suggestion, traits, issues, retry_at, cache_hit, created_at)
       select r.id, r.organization_id, r.email, r.result, r.accept, r.status, r.score, r.suggestion, r.traits, r.issues, r.retry_at, r.cache_hit, r.created_at
       from ac, json_populate_recordset(null::email_verifications, ?::json) r`,
      [
        JSON.stringify(
          items.map((v) => ({
            id: v.id,
            organization_id: v.organizationId,
            email: v.email,
            result: v.result,
            accept: v.accept,
            status: v.status,
            score: v.score,
            suggestion: v.suggestion,
            traits: v.traits,
            issues: v.issues,
            retry_at: v.retryAt,
            cache_hit: v.cacheHit,
            created_at: v.createdAt,
          })),
        ),
      ],
    );
    return new Array<void>(items.length);
  }
}

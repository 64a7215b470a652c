import type { Connection } from '@mikro-orm/core';
import type { EntityManager } from '@mikro-orm/postgresql';
import { MicroBatcher } from './batcher.js';
import { RECURRING_BOUNCES, type HistoryRow } from './history.js';
import { ensureQuotaRow, insertVerifications, takeQuotaAndReadHistory, type Row } from './queries.js';
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
          await ensureQuotaRow(this.connection(), organizationId, month);
          if (this.ensured.size >= ENSURED_MAX) this.ensured.clear();
          this.ensured.add(key);
        }
        const lookups = indexes.filter((i) => items[i]!.email).map((i) => ({ i, email: items[i]!.email, domain: items[i]!.domain }));
        const row = await takeQuotaAndReadHistory(this.connection(), {
          organizationId,
          month,
          units: indexes.length,
          lookups,
          recurringBounces: RECURRING_BOUNCES,
        });
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
    await insertVerifications(
      this.connection(),
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
    );
    return new Array<void>(items.length);
  }
}

import type { EntityManager } from '@mikro-orm/postgresql';
import type { Orm } from '../db/orm.js';
import type { Logger } from '../logger.js';
import { recordCampaignEngagement } from './campaigns.js';
import { recordTrackingEvents } from '../webhooks/queries.js';
import { historyKey } from '../verification/history.js';
import { insertTrackingEvents, insertTrackingEventsOnce, setFirstEngagement, upsertHistory, type HistoryOutcomes, type TrackingEventColumns } from './queries.js';

export interface TrackingHit {
  emailId: string;
  type: 'open' | 'click';
  at: Date;
  ip: string | null;
  userAgent: string | null;
  url: string | null;
}

export interface RecorderOptions {
  /** A hit waits at most this long before it is written. */
  flushEveryMs?: number;
  /** Hits written by one transaction. */
  maxBatch?: number;
  /** Hits kept in memory while PostgreSQL is unavailable; beyond this they are dropped (logged). */
  maxBuffered?: number;
}

const DEFAULTS: Required<RecorderOptions> = { flushEveryMs: 5, maxBatch: 2_000, maxBuffered: 200_000 };
const RETRY_MS = [50, 100, 250, 500, 1_000, 2_000];
/** On shutdown a batch that keeps failing is given up after this many tries. */
const CLOSING_TRIES = 5;

/**
 * Writes tracking hits in the background so that the pixel and the redirect answer at once:
 * hits are buffered in memory and written every few milliseconds, one transaction per batch
 * (events inserted in one statement, first open / first click set by conditional updates,
 * campaign counters and `email.opened` / `email.clicked` webhooks for the emails that changed). `close()`
 * writes what is buffered (graceful shutdown loses no hit).
 */
/**
 * Emails whose first open / first click this process has seen written: their later hits
 * skip the conditional updates (a cache only: the `is null` condition stays the guard).
 */
export interface KnownFirsts {
  opened: Set<string>;
  clicked: Set<string>;
}
const KNOWN_MAX = 100_000;

export class TrackingRecorder {
  private readonly known: KnownFirsts = { opened: new Set(), clicked: new Set() };
  private buffer: TrackingHit[] = [];
  private timer: NodeJS.Timeout | undefined;
  private draining: Promise<void> | undefined;
  private closing = false;
  private dropped = 0;
  private readonly o: Required<RecorderOptions>;

  constructor(
    private readonly orm: Orm,
    private readonly log: Logger,
    options: RecorderOptions = {},
  ) {
    this.o = { ...DEFAULTS, ...options };
  }

  record(hit: TrackingHit): void {
    if (this.buffer.length >= this.o.maxBuffered) {
      if (this.dropped++ % 1_000 === 0) this.log.error({ dropped: this.dropped }, 'tracking buffer full: hits dropped');
      return;
    }
    this.buffer.push(hit);
    this.kick();
  }

  /** Hits not yet written. */
  get pending(): number {
    return this.buffer.length;
  }

  async close(): Promise<void> {
    this.closing = true;
    clearTimeout(this.timer);
    this.timer = undefined;
    if (!this.draining && this.buffer.length > 0) this.startDrain();
    while (this.draining) await this.draining;
  }

  private kick(): void {
    if (this.draining || this.timer) return;
    // A hit that arrives while the app closes is written at once.
    if (this.closing) return this.startDrain();
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.startDrain();
    }, this.o.flushEveryMs);
  }

  private startDrain(): void {
    this.draining = this.drain().finally(() => {
      this.draining = undefined;
      if (this.buffer.length > 0) {
        if (this.closing) this.startDrain();
        else this.kick();
      }
    });
  }

  /** After the commit: every email of the batch now has its first open (and click, if clicked). */
  private remember(batch: TrackingHit[]): void {
    if (this.known.opened.size > KNOWN_MAX) this.known.opened.clear();
    if (this.known.clicked.size > KNOWN_MAX) this.known.clicked.clear();
    for (const hit of batch) {
      this.known.opened.add(hit.emailId);
      if (hit.type === 'click') this.known.clicked.add(hit.emailId);
    }
  }

  private async drain(): Promise<void> {
    let failures = 0;
    while (this.buffer.length > 0) {
      const batch = this.buffer.splice(0, this.o.maxBatch);
      try {
        if (this.allKnown(batch)) {
          // Every email of the batch already has its first open (and click): the events
          // alone, one statement on a pooled connection (its own implicit transaction).
          await insertTrackingEventsOnce(this.orm.em, eventColumns(batch));
        } else {
          await this.orm.em.fork().transactional((em) => writeHits(em as EntityManager, batch, this.known));
          this.remember(batch);
        }
        failures = 0;
      } catch (error) {
        failures++;
        if (this.closing && failures >= CLOSING_TRIES) {
          this.log.error({ err: error, lost: batch.length }, 'tracking hits could not be written before shutdown');
          continue;
        }
        this.log.warn({ err: error, hits: batch.length }, 'tracking hits not written yet; retrying');
        this.buffer.unshift(...batch);
        await new Promise((resolve) => setTimeout(resolve, RETRY_MS[Math.min(failures - 1, RETRY_MS.length - 1)]));
      }
    }
  }

  /** The batch has no hit that could be an email's first open or first click. */
  private allKnown(batch: TrackingHit[]): boolean {
    const { opened, clicked } = this.known;
    for (const hit of batch) {
      if (!opened.has(hit.emailId) || (hit.type === 'click' && !clicked.has(hit.emailId))) return false;
    }
    return true;
  }
}

function eventColumns(hits: TrackingHit[]): TrackingEventColumns {
  const n = hits.length;
  const ids = new Array<string>(n);
  const types = new Array<string>(n);
  const ats = new Array<string>(n);
  const ips = new Array<string | null>(n);
  const uas = new Array<string | null>(n);
  const urls = new Array<string | null>(n);
  for (let i = 0; i < n; i++) {
    const h = hits[i]!;
    ids[i] = h.emailId;
    types[i] = h.type;
    ats[i] = h.at.toISOString();
    ips[i] = h.ip;
    uas[i] = h.userAgent;
    urls[i] = h.url;
  }
  return [ids, types, ats, ips, uas, urls];
}

/**
 * One batch in one transaction. The first open and first click are conditional updates
 * (`where first_opened_at is null`): under concurrent batches (several API processes) the
 * row lock makes the second see the value set by the first, so each email changes, and its
 * campaign counter moves, exactly once. A click is also the email's open when none was seen
 * (images blocked): docs/outcomes.md.
 */
export async function writeHits(em: EntityManager, hits: TrackingHit[], known?: KnownFirsts): Promise<void> {
  await insertTrackingEvents(em, eventColumns(hits));

  // The earliest hit per email, leaving out the emails this process already saw set.
  const earliest = (type: 'open' | 'click') => {
    const seen = type === 'open' ? known?.opened : known?.clicked;
    const first = new Map<string, Date>();
    for (const h of hits) {
      if ((type === 'click' && h.type !== 'click') || seen?.has(h.emailId)) continue;
      const at = first.get(h.emailId);
      if (!at || h.at < at) first.set(h.emailId, h.at);
    }
    return [...first].map(([id, at]) => ({ id, at: at.toISOString() }));
  };
  const firsts = async (type: 'open' | 'click') => {
    const candidates = earliest(type);
    if (candidates.length === 0) return [];
    return setFirstEngagement(em, type, candidates);
  };
  // Two batches locking the same rows in opposite orders may deadlock: PostgreSQL aborts
  // one, and the recorder writes that batch again (every step is conditional or additive
  // within this transaction).
  const opened = await firsts('open');
  const clicked = await firsts('click');
  await recordTrackingEvents(em, opened, clicked, hits);

  for (const [kind, rows] of [['opened', opened], ['clicked', clicked]] as const) {
    const perCampaign = new Map<string, number>();
    for (const row of rows) if (row.campaign_id) perCampaign.set(row.campaign_id, (perCampaign.get(row.campaign_id) ?? 0) + 1);
    for (const [campaignId, count] of perCampaign) await recordCampaignEngagement(em, campaignId, kind, count);
  }
  // docs/security.md (the global verification history): an open or a click proves the mailbox of an email that went to it alone
  // (docs/security.md: with a cc or a bcc, another copy carries the same pixel and links, and a
  // tenant could mark any address deliverable for every organization with a bcc to itself).
  const proven = new Map<string, HistoryOutcomes>();
  for (const row of [...opened, ...clicked]) {
    if (!row.proves) continue;
    const key = historyKey(row.proves);
    const at = new Date(row.at);
    const earlier = proven.get(key.email);
    if (!earlier || earlier.proven_at! < at) proven.set(key.email, { ...key, hard_bounced_at: null, complained_at: null, mailbox_full_at: null, mailbox_not_found_at: null, proven_at: at });
  }
  await upsertHistory(em, [...proven.values()], new Date());
}

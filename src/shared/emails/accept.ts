import type { EntityManager } from '@mikro-orm/postgresql';
import { ConflictError } from '../errors.js';
import { newId } from '../ids.js';
import { withConnection, type Sql } from '../db/sql.js';
import type { NewEmail } from './input.js';

/**
 * The write path of accepted mail: every way in (`POST /emails` with or without an
 * Idempotency-Key, the batch, confirmation and test sends) comes here as a list of
 * requests, and a list of any length is written with the same two statements. See
 * docs/emails.md "Accepting mail".
 *
 * - The rows go in as arrays (`unnest`), so the statement text is the same whatever the
 *   number of rows: parsed and planned cheaply, values bound, never escaped into the SQL.
 * - Without a key the INSERT is one statement, atomic on its own: no BEGIN/COMMIT.
 * - With keys, the key rows and the emails are written by ONE statement (a data-modifying
 *   CTE): an email row is written only when its request's key row was inserted (or an
 *   expired one taken over) by that same statement, so the two commit together or not at
 *   all. A concurrent statement inserting the same key waits on the key's row lock
 *   (`lock_timeout`) and then sees it taken.
 */

/** One caller's request: its emails are written all or nothing, and answered together. */
export interface AcceptRequest {
  emails: NewEmail[];
  idempotency?: Idempotency;
}

export interface Idempotency {
  key: string;
  /** SHA-256 of the request (route and validated body). */
  requestHash: string;
  /** How long to wait for an earlier request with the key to finish before 409 (ms). */
  waitMs?: number;
}

export interface CreatedEmails {
  ids: string[];
  /** True when an earlier request with the same Idempotency-Key is answered again. */
  replayed: boolean;
}

/** Per request, in order: what was written (or replayed), or why not. */
export type AcceptResult = { ok: CreatedEmails } | { error: unknown };

// How long a request waits for an earlier one with the same key to finish before 409.
export const IDEMPOTENCY_WAIT_MS = 5_000;
export const IDEMPOTENCY_TTL_HOURS = 24;

const COLUMNS = [
  'id',
  'organization_id',
  'source',
  'campaign_id',
  'subscriber_id',
  'from_address',
  'to_address',
  'cc',
  'bcc',
  'reply_to',
  'subject',
  'content_kind',
  'content',
  'preview',
  'text',
  'tags',
  'headers',
] as const;
const JSONB = new Set(['cc', 'bcc', 'reply_to', 'tags', 'headers']);
const quote = (c: string) => `"${c}"`;
// The rows as parallel arrays, one a column; the JSON columns travel as text and are cast.
const rows = (columns: readonly string[]) => `unnest(${columns.map(() => '?::text[]').join(', ')}) as r(${columns.map(quote).join(', ')})`;
const ROWS = rows(COLUMNS);
const SELECT_ROWS = COLUMNS.map((c) => (JSONB.has(c) ? `r.${quote(c)}::jsonb` : `r.${quote(c)}`)).join(', ');
const INSERT_INTO = `insert into emails (${COLUMNS.map(quote).join(', ')})`;

/** Emails only (no key): one statement. */
const INSERT_SQL = `${INSERT_INTO} select ${SELECT_ROWS} from ${ROWS}`;

/**
 * Keys and emails in one statement. `k` are the key rows (organization, key, hash, the
 * request's ids as an array literal); each email row carries its request's key (null when
 * the request has none) and is inserted only when that key was claimed here.
 */
const INSERT_KEYED_SQL = `
  with claimed as (
    insert into email_idempotency_keys (organization_id, idempotency_key, request_hash, email_ids, created_at)
    select k.organization_id, k.idempotency_key, k.request_hash, k.email_ids::text[], now()
      from unnest(?::text[], ?::text[], ?::text[], ?::text[]) as k(organization_id, idempotency_key, request_hash, email_ids)
    on conflict (organization_id, idempotency_key) do update
      set request_hash = excluded.request_hash, email_ids = excluded.email_ids, created_at = excluded.created_at
      where email_idempotency_keys.created_at < now() - interval '${IDEMPOTENCY_TTL_HOURS} hours'
    returning organization_id, idempotency_key
  ), written as (
    ${INSERT_INTO}
    select ${SELECT_ROWS}
      from ${rows([...COLUMNS, 'key'])}
     where r."key" is null
        or exists (select 1 from claimed c where c.organization_id = r.organization_id and c.idempotency_key = r."key")
  )
  select organization_id, idempotency_key from claimed`;

/** The earlier requests' key rows, for the keys this statement did not claim. */
const EARLIER_SQL = `
  select organization_id, idempotency_key, request_hash, email_ids
    from email_idempotency_keys
   where (organization_id, idempotency_key) in (select * from unnest(?::text[], ?::text[]))`;

const json = (value: unknown) => (value === null || value === undefined ? null : JSON.stringify(value));

/** The email rows as one array a column, in COLUMNS order (plus each row's key when keyed). */
function columnArrays(inputs: NewEmail[], ids: string[], keys?: (string | null)[]): unknown[] {
  const cols: unknown[][] = Array.from({ length: COLUMNS.length + (keys ? 1 : 0) }, () => new Array(inputs.length));
  inputs.forEach((e, i) => {
    cols[0]![i] = ids[i];
    cols[1]![i] = e.organizationId;
    cols[2]![i] = e.source ?? 'api';
    cols[3]![i] = e.campaignId ?? null;
    cols[4]![i] = e.subscriberId ?? null;
    cols[5]![i] = e.from;
    cols[6]![i] = e.to;
    cols[7]![i] = json(e.cc);
    cols[8]![i] = json(e.bcc);
    cols[9]![i] = json(e.replyTo);
    cols[10]![i] = e.subject;
    cols[11]![i] = e.contentKind;
    cols[12]![i] = e.content;
    cols[13]![i] = e.preview ?? null;
    cols[14]![i] = e.text ?? null;
    cols[15]![i] = JSON.stringify(e.tags ?? []);
    cols[16]![i] = JSON.stringify(e.headers ?? {});
    if (keys) cols[17]![i] = keys[i];
  });
  return cols;
}

/**
 * Inserts the rows (status queued) in ONE statement and returns their ids, in order. With
 * an EntityManager the statement runs on its own (atomic); with a `Sql` inside the caller's
 * transaction. The caller enqueues with `enqueueEmailSends` after the commit.
 */
export async function insertEmails(db: EntityManager | Sql, inputs: NewEmail[], ids: string[] = inputs.map(() => newId('eml'))): Promise<string[]> {
  if (inputs.length === 0) return [];
  const params = columnArrays(inputs, ids);
  if ('query' in db) await db.query(INSERT_SQL, params, 'mailroom_emails_insert');
  else await withConnection(db, (sql) => sql.query(INSERT_SQL, params, 'mailroom_emails_insert'));
  return ids;
}

const scope = (organizationId: string, key: string) => `${organizationId}\n${key}`;

/**
 * Writes the requests together: one statement (two when a key was used before), one
 * commit. Each request gets its own answer; a request's failure (a key still held by a
 * running request past its wait) does not fail the others: when the shared statement
 * fails, every request is written again on its own, so each gets its own result.
 */
export async function acceptRequests(em: EntityManager, requests: AcceptRequest[]): Promise<AcceptResult[]> {
  // The same key twice in one statement would be a conflict within the statement: the later
  // requests run after the earlier has committed, as they would have arrived.
  const seen = new Set<string>();
  const now: number[] = [];
  const later: number[] = [];
  requests.forEach((r, i) => {
    const key = r.idempotency && scope(r.emails[0]!.organizationId, r.idempotency.key);
    if (key && seen.has(key)) later.push(i);
    else {
      if (key) seen.add(key);
      now.push(i);
    }
  });
  const results = new Array<AcceptResult>(requests.length);
  const first = await writeOrSplit(em, now.map((i) => requests[i]!));
  now.forEach((i, n) => (results[i] = first[n]!));
  if (later.length > 0) {
    const rest = await acceptRequests(em, later.map((i) => requests[i]!));
    later.forEach((i, n) => (results[i] = rest[n]!));
  }
  return results;
}

async function writeOrSplit(em: EntityManager, requests: AcceptRequest[]): Promise<AcceptResult[]> {
  try {
    return await write(em, requests);
  } catch (error) {
    if (requests.length === 1) return [{ error: mapError(error) }];
    const results: AcceptResult[] = [];
    for (const request of requests) {
      try {
        results.push(...(await write(em, [request])));
      } catch (own) {
        results.push({ error: mapError(own) });
      }
    }
    return results;
  }
}

function mapError(error: unknown): unknown {
  if ((error as { code?: string }).code === '55P03') {
    return new ConflictError('idempotency_conflict', 'A request with this Idempotency-Key is still being processed; retry shortly');
  }
  return error;
}

/** One statement for all the requests (keys unique among them); throws when it fails. */
async function write(em: EntityManager, requests: AcceptRequest[]): Promise<AcceptResult[]> {
  const inputs: NewEmail[] = [];
  const ids: string[] = [];
  const rowKeys: (string | null)[] = [];
  const requestIds = requests.map((r) => {
    const own = r.emails.map(() => newId('eml'));
    for (const [i, e] of r.emails.entries()) {
      inputs.push(e);
      ids.push(own[i]!);
      rowKeys.push(r.idempotency?.key ?? null);
    }
    return own;
  });
  const keyed = requests.map((r, i) => ({ r, i })).filter(({ r }) => r.idempotency);
  if (keyed.length === 0) {
    await withConnection(em, (sql) => sql.query(INSERT_SQL, columnArrays(inputs, ids), 'mailroom_emails_insert'));
    return requestIds.map((own) => ({ ok: { ids: own, replayed: false } }));
  }

  // Key rows in a fixed order, so two statements claiming the same keys cannot deadlock.
  keyed.sort((a, b) => {
    const x = scope(a.r.emails[0]!.organizationId, a.r.idempotency!.key);
    const y = scope(b.r.emails[0]!.organizationId, b.r.idempotency!.key);
    return x < y ? -1 : x > y ? 1 : 0;
  });
  const waitMs = Math.max(...keyed.map(({ r }) => r.idempotency!.waitMs ?? IDEMPOTENCY_WAIT_MS));
  return withConnection(em, async (sql) => {
    // lock_timeout bounds the wait on a key that another request holds; `set local` needs
    // a transaction, which the one statement then runs in.
    await sql.query(`begin; set local lock_timeout = ${Math.max(1, Math.round(waitMs))}`);
    try {
      const claimed = await sql.query<{ organization_id: string; idempotency_key: string }>(INSERT_KEYED_SQL, [
        keyed.map(({ r }) => r.emails[0]!.organizationId),
        keyed.map(({ r }) => r.idempotency!.key),
        keyed.map(({ r }) => r.idempotency!.requestHash),
        // A PG array literal: ids are [0-9a-z_] only.
        keyed.map(({ i }) => `{${requestIds[i]!.join(',')}}`),
        ...columnArrays(inputs, ids, rowKeys),
      ], 'mailroom_emails_insert_keyed');
      const won = new Set(claimed.map((c) => scope(c.organization_id, c.idempotency_key)));
      const lost = keyed.filter(({ r }) => !won.has(scope(r.emails[0]!.organizationId, r.idempotency!.key)));
      const earlier = new Map<string, { request_hash: string; email_ids: string[] }>();
      if (lost.length > 0) {
        const rows = await sql.query<{ organization_id: string; idempotency_key: string; request_hash: string; email_ids: string[] }>(EARLIER_SQL, [
          lost.map(({ r }) => r.emails[0]!.organizationId),
          lost.map(({ r }) => r.idempotency!.key),
        ]);
        for (const row of rows) earlier.set(scope(row.organization_id, row.idempotency_key), row);
      }
      await sql.query('commit');
      return requests.map((r, i): AcceptResult => {
        if (!r.idempotency) return { ok: { ids: requestIds[i]!, replayed: false } };
        const key = scope(r.emails[0]!.organizationId, r.idempotency.key);
        if (won.has(key)) return { ok: { ids: requestIds[i]!, replayed: false } };
        const row = earlier.get(key);
        if (!row) return { error: new ConflictError('idempotency_conflict', 'The Idempotency-Key changed state during the request; retry') };
        if (row.request_hash !== r.idempotency.requestHash) {
          return { error: new ConflictError('idempotency_conflict', 'This Idempotency-Key was already used with a different request body') };
        }
        return { ok: { ids: row.email_ids, replayed: true } };
      });
    } catch (error) {
      await sql.query('rollback').catch(() => {});
      throw error;
    }
  });
}

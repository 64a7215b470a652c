import type { EntityManager } from '@mikro-orm/postgresql';
import { isDependencyDown } from '../dependency-errors.js';
import { ConflictError } from '../errors.js';
import { newId } from '../ids.js';
import type { Sql } from '../db/sql.js';
import { insertEmailRows, insertKeyedEmails, scopedKey } from './queries.js';
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
 *   all. A statement meeting a key that another one is writing now does not wait for it:
 *   409 while the first runs, its answer again once it committed (see queries.ts).
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
}

export interface CreatedEmails {
  ids: string[];
  /** True when an earlier request with the same Idempotency-Key is answered again. */
  replayed: boolean;
}

/** Per request, in order: what was written (or replayed), or why not. */
export type AcceptResult = { ok: CreatedEmails } | { error: unknown };

const STILL_RUNNING = 'A request with this Idempotency-Key is still being processed; retry shortly';

/**
 * Inserts the rows (status queued) in ONE statement and returns their ids, in order. With
 * an EntityManager the statement runs on its own (atomic); with a `Sql` inside the caller's
 * transaction. The caller enqueues with `enqueueEmailSends` after the commit.
 */
export async function insertEmails(db: EntityManager | Sql, inputs: NewEmail[], ids: string[] = inputs.map(() => newId('eml'))): Promise<string[]> {
  await insertEmailRows(db, inputs, ids);
  return ids;
}

/**
 * Writes the requests together: one statement (two when a key was used before), one
 * commit. Each request gets its own answer; one request's failure does not fail the others
 * (see writeOrSplit).
 */
export async function acceptRequests(em: EntityManager, requests: AcceptRequest[]): Promise<AcceptResult[]> {
  // The same key twice in one group: only the first is written. A repeat gets the first's
  // answer when that was an earlier, committed request's (the same ids, or 409 for another
  // body); when the first is writing it now, the repeat arrived while it runs: 409 (docs/emails.md "Idempotency-Key").
  const firstOf = new Map<string, number>();
  const now: number[] = [];
  const repeats: Array<{ i: number; first: number }> = [];
  requests.forEach((r, i) => {
    const key = r.idempotency && scopedKey(r.emails[0]!.organizationId, r.idempotency.key);
    const first = key === undefined ? undefined : firstOf.get(key);
    if (first !== undefined) repeats.push({ i, first });
    else {
      if (key) firstOf.set(key, i);
      now.push(i);
    }
  });
  const results = new Array<AcceptResult>(requests.length);
  const written = await writeOrSplit(em, now.map((i) => requests[i]!));
  now.forEach((i, n) => (results[i] = written[n]!));
  for (const { i, first } of repeats) {
    const answer = results[first]!;
    const earlier = 'ok' in answer && answer.ok.replayed;
    if (!earlier) results[i] = { error: new ConflictError('idempotency_conflict', STILL_RUNNING) };
    else if (requests[i]!.idempotency!.requestHash !== requests[first]!.idempotency!.requestHash) results[i] = { error: differentBody() };
    else results[i] = answer;
  }
  return results;
}

/**
 * One statement for the requests; when it fails (a deadlock, a constraint), the requests
 * without a key go together again and each keyed one alone, so that each gets its own answer
 * and a group of hundreds is not written one by one.
 */
async function writeOrSplit(em: EntityManager, requests: AcceptRequest[]): Promise<AcceptResult[]> {
  try {
    return await write(em, requests);
  } catch (error) {
    // PostgreSQL unreachable fails every request alike: one answer (503) for all, not one
    // more connection attempt (3 s each) per request of the group.
    if (requests.length === 1 || isDependencyDown(error)) return requests.map(() => ({ error }));
    // The unkeyed requests together (unless they are the whole group that failed: then one
    // by one), each keyed one alone.
    const unkeyed = requests.flatMap((r, i) => (r.idempotency ? [] : [i]));
    const keyed = requests.flatMap((r, i) => (r.idempotency ? [[i]] : []));
    const parts = keyed.length === 0 ? unkeyed.map((i) => [i]) : [...(unkeyed.length > 0 ? [unkeyed] : []), ...keyed];
    const results = new Array<AcceptResult>(requests.length);
    for (const part of parts) {
      const answers = await writeOrSplit(em, part.map((i) => requests[i]!));
      part.forEach((i, n) => (results[i] = answers[n]!));
    }
    return results;
  }
}

const differentBody = () => new ConflictError('idempotency_conflict', 'This Idempotency-Key was already used with a different request body');

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
  // Each keyed request with its key scoped to its organization (keys are per organization).
  const keyed = requests.flatMap((r, i) => (r.idempotency ? [{ i, idempotency: r.idempotency, organizationId: r.emails[0]!.organizationId, scoped: scopedKey(r.emails[0]!.organizationId, r.idempotency.key) }] : []));
  if (keyed.length === 0) {
    await insertEmailRows(em, inputs, ids);
    return requestIds.map((own) => ({ ok: { ids: own, replayed: false } }));
  }

  const { claimed, busy, earlier: rows } = await insertKeyedEmails(em, {
    keys: keyed.map((k) => ({ organizationId: k.organizationId, key: k.idempotency.key, requestHash: k.idempotency.requestHash, emailIds: requestIds[k.i]! })),
    emails: inputs,
    ids,
    rowKeys,
  });
  const won = new Set(claimed.map((c) => scopedKey(c.organization_id, c.idempotency_key)));
  const running = new Set(busy.map((c) => scopedKey(c.organization_id, c.idempotency_key)));
  const earlier = new Map(rows.map((row) => [scopedKey(row.organization_id, row.idempotency_key), row]));
  const results = requestIds.map((own): AcceptResult => ({ ok: { ids: own, replayed: false } }));
  for (const { i, idempotency, scoped } of keyed) {
    if (won.has(scoped)) continue;
    if (running.has(scoped)) {
      results[i] = { error: new ConflictError('idempotency_conflict', STILL_RUNNING) };
      continue;
    }
    const row = earlier.get(scoped);
    if (!row) results[i] = { error: new ConflictError('idempotency_conflict', 'The Idempotency-Key changed state during the request; retry') };
    else if (row.request_hash !== idempotency.requestHash) {
      results[i] = { error: differentBody() };
    } else results[i] = { ok: { ids: row.email_ids, replayed: true } };
  }
  return results;
}

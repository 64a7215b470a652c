import type { EntityManager } from '@mikro-orm/postgresql';
import { newId } from '../ids.js';
import { cleanFields, cleanTagNames, EmailAddress, FIELDS_MAX, TAGS_MAX } from './input.js';
import { ensureTags } from './service.js';
import { inTransaction } from '../db/sql.js';
import { insertTagPairs, upsertImported } from './queries.js';

/**
 * Bulk import of subscribers (`cli subscribers import FILE.csv`). Semantics are those of
 * `POST /subscribers` with `skipDoubleOptIn: true` (the operator vouches for the list):
 * upsert by address, tags added, fields merged, an empty cell changes nothing; new and
 * pending contacts become SUBSCRIBED, UNSUBSCRIBED ones too unless resubscribe is off;
 * BOUNCED, COMPLAINED and BANNED stay. Each batch is one transaction of a few statements.
 */

export const RESERVED_COLUMNS = ['email', 'name', 'phone', 'tags'] as const;

/** A first line the import cannot take (thrown by the parser's header callback, importCsvOptions). */
export class CsvHeaderError extends Error {
  override name = 'CsvHeaderError';
}

/** A column's name as the import reads it, from a CSV header or an API record's key. */
function columnName(name: string): string {
  return name.trim().toLowerCase();
}

/** A name given twice among `names` (empty names aside). */
function repeatedName(names: readonly string[]): string | undefined {
  return names.find((name, i) => name !== '' && names.indexOf(name) !== i);
}

/**
 * How an import file is read, by the CLI (streamed) and the dashboard (an upload) alike
 * (csv-parse options): header names trimmed and lower-cased, a byte-order mark and empty
 * lines ignored, cells trimmed, rows of any length, and each record with its own line number
 * (`info`: the parser reads ahead, so its running counters name a later line).
 */
export function importCsvOptions(columns: (names: string[]) => string[] = (names) => names) {
  return {
    bom: true,
    columns: (header: string[]) => {
      const names = header.map(columnName);
      // Two columns of one name: the parser would keep the last value of each row, and lose the other.
      const twice = repeatedName(names);
      if (twice !== undefined) throw new CsvHeaderError(`the column "${twice}" appears twice in the first line`);
      return columns(names);
    },
    skip_empty_lines: true,
    relax_column_count: true,
    trim: true,
    info: true,
  } as const;
}
const NAME_MAX = 255;
const PHONE_MAX = 50;

export interface ImportRow {
  email: string;
  name: string | null;
  phone: string | null;
  tags: string[];
  fields: Record<string, string>;
}

export type ParsedRecord = { row: ImportRow; warnings: string[] } | { error: string };

/** One CSV record (header names lower-cased) to an import row, or why it is skipped. */
export function parseImportRecord(record: Record<string, string | undefined>): ParsedRecord {
  const email = EmailAddress.safeParse(record.email ?? '');
  if (!email.success) return { error: `invalid email address "${(record.email ?? '').slice(0, 80)}"` };
  const name = record.name?.trim() || null;
  const phone = record.phone?.trim() || null;
  if (name && name.length > NAME_MAX) return { error: `name longer than ${NAME_MAX} characters` };
  if (phone && phone.length > PHONE_MAX) return { error: `phone longer than ${PHONE_MAX} characters` };
  const given = (record.tags ?? '').split(/[;|]/).filter((t) => t.trim() !== '');
  // As `POST /subscribers` refuses them (422), a row is skipped, not cut short.
  if (given.length > TAGS_MAX) return { error: `more than ${TAGS_MAX} tags (${given.length})` };
  const tags = cleanTagNames(given);
  const raw: Record<string, string> = {};
  for (const [column, value] of Object.entries(record)) {
    if ((RESERVED_COLUMNS as readonly string[]).includes(column) || value === undefined || value === '') continue;
    raw[column] = value;
  }
  if (Object.keys(raw).length > FIELDS_MAX) return { error: `more than ${FIELDS_MAX} fields (${Object.keys(raw).length})` };
  const fields = cleanFields(raw);
  return { row: { email: email.data, name, phone, tags: tags.names, fields: fields.set }, warnings: [...tags.warnings, ...fields.warnings] };
}

/** Rows of one address in one batch are merged (a statement may touch a row only once). */
export function mergeByEmail(rows: readonly ImportRow[]): ImportRow[] {
  const merged = new Map<string, ImportRow>();
  for (const row of rows) {
    const seen = merged.get(row.email);
    if (!seen) {
      merged.set(row.email, { ...row, tags: [...row.tags], fields: { ...row.fields } });
      continue;
    }
    seen.name = row.name ?? seen.name;
    seen.phone = row.phone ?? seen.phone;
    Object.assign(seen.fields, row.fields);
    const have = new Set(seen.tags.map((t) => t.toLowerCase()));
    for (const tag of row.tags) if (!have.has(tag.toLowerCase())) seen.tags.push(tag);
  }
  // One lock order for every batch, so concurrent imports never deadlock on each other.
  return [...merged.values()].sort((a, b) => (a.email < b.email ? -1 : a.email > b.email ? 1 : 0));
}

export interface BatchResult {
  created: number;
  updated: number;
  /** Rows of the batch folded into an earlier row of the same address (counted once above). */
  merged: number;
}

export async function importBatch(
  em: EntityManager,
  organizationId: string,
  batch: readonly ImportRow[],
  options: { resubscribe: boolean; now: Date },
): Promise<BatchResult> {
  const rows = mergeByEmail(batch);
  const merged = batch.length - rows.length;
  if (rows.length === 0) return { created: 0, updated: 0, merged };
  const { now } = options;
  return inTransaction(em, async (tx) => {
    const tagNames = cleanTagNames(rows.flatMap((r) => r.tags)).names;
    const tags = await ensureTags(tx, organizationId, tagNames, now);
    const tagIds = new Map(tags.map((t) => [t.name.toLowerCase(), t.id]));

    const upserted = await upsertImported(
      tx,
      organizationId,
      rows.map((r) => ({ id: newId('sub'), email: r.email, name: r.name, phone: r.phone, fields: r.fields })),
      options,
    );

    const idByEmail = new Map(upserted.map((r) => [r.email, r.id]));
    const pairs: Array<{ s: string; t: string }> = [];
    for (const row of rows) {
      const subscriberId = idByEmail.get(row.email);
      if (!subscriberId) continue;
      for (const tag of row.tags) {
        const tagId = tagIds.get(tag.toLowerCase());
        if (tagId) pairs.push({ s: subscriberId, t: tagId });
      }
    }
    if (pairs.length > 0) {
      await insertTagPairs(tx, pairs, now);
    }
    const created = upserted.filter((r) => r.inserted).length;
    return { created, updated: upserted.length - created, merged };
  }, { asyncCommit: true });
}

/** What `importRecords` did with a batch of CSV records (`POST /subscribers/import`). */
export interface RecordsResult extends BatchResult {
  /** Records not imported, by their index in the batch, with why. */
  skipped: Array<{ index: number; error: string }>;
  /** What was left out of imported records (a tag or field name refused), by index. */
  warnings: Array<{ index: number; warning: string }>;
}

/**
 * A batch of CSV records (header names lower-cased, as `importCsvOptions` reads them), read
 * by `parseImportRecord` and imported by `importBatch` in one transaction: the API's end of
 * `subscribers import` run with a token.
 */
export async function importRecords(
  em: EntityManager,
  organizationId: string,
  records: readonly Record<string, string>[],
  options: { resubscribe: boolean; now: Date },
): Promise<RecordsResult> {
  const rows: ImportRow[] = [];
  const skipped: RecordsResult['skipped'] = [];
  const warnings: RecordsResult['warnings'] = [];
  records.forEach((given, index) => {
    // Read as the CSV reader reads a file: names trimmed and lower-cased, cells trimmed.
    const names = Object.keys(given).map(columnName);
    const twice = repeatedName(names);
    if (twice !== undefined) return void skipped.push({ index, error: `the column "${twice}" appears twice` });
    if (!names.includes('email')) return void skipped.push({ index, error: 'no email column' });
    const record = Object.fromEntries(Object.entries(given).map(([name, value]) => [columnName(name), value.trim()]));
    const parsed = parseImportRecord(record);
    if ('error' in parsed) return void skipped.push({ index, error: parsed.error });
    for (const warning of parsed.warnings) warnings.push({ index, warning });
    rows.push(parsed.row);
  });
  return { ...(await importBatch(em, organizationId, rows, options)), skipped, warnings };
}

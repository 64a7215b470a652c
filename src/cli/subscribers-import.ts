import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { SingleBar } from 'cli-progress';
import { CsvError, parse } from 'csv-parse';
import type { Config } from '../shared/config.js';
import { initOrm } from '../shared/db/orm.js';
import { AppError, NotFoundError } from '../shared/errors.js';
import { CsvHeaderError, importBatch, importCsvOptions, parseImportRecord, type BatchResult, type ImportRow, type RecordsResult } from '../shared/subscribers/import.js';
import { apiTarget, callApi } from './api-client.js';
import { organizationExists } from '../shared/organizations/queries.js';

// Rows per transaction: large enough that a batch costs a few round trips per thousand
// rows, small enough that one batch's locks and memory stay modest.
const BATCH_SIZE = 2_000;
// Through the API: the records a request of `POST /subscribers/import` takes, and the JSON
// bytes a request carries at most (the API's body limit is 1 MiB).
const API_BATCH_SIZE = 1_000;
const API_BATCH_BYTES = 768 * 1024;
// Skipped rows are listed on stderr up to this many; the summary counts them all.
const SHOWN_PROBLEMS = 20;

export interface ImportSummary {
  file: string;
  /** Null through the API: the token's organization. */
  organizationId: string | null;
  rows: number;
  created: number;
  updated: number;
  skipped: number;
  /** Rows of an address already met in the same batch of 2,000, merged into it: rows = created + updated + skipped + merged. */
  merged: number;
  warnings: number;
  seconds: number;
  rowsPerSecond: number;
}

/**
 * `subscribers import FILE.csv --org ORG_ID [--no-resubscribe] [--json]` (operator: the
 * database directly), or without `--org` and with MAILROOM_TOKEN (user: through the API, as
 * the token's organization, `POST /api/v2/subscribers/import` a thousand records at a time).
 */
export async function subscribersImport(config: Config, args: string[], usage: (message: string) => Error): Promise<void> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      org: { type: 'string' },
      'no-resubscribe': { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
    },
  });
  const file = positionals[0];
  if (!file) throw usage('subscribers import needs a CSV file');
  const target = values.org ? undefined : apiTarget();
  if (!values.org && !target) throw usage('subscribers import needs --org ORG_ID (the database directly) or MAILROOM_TOKEN (through the API)');
  const organizationId = values.org ?? null;
  const found = await stat(file).catch(() => {
    throw new NotFoundError(`cannot read ${file}`);
  });
  if (!found.isFile()) throw new AppError(422, 'invalid_csv', `${file} is not a file`);
  const size = found.size;

  const orm = organizationId ? await initOrm({ databaseUrl: config.databaseUrl, poolSize: 2 }) : undefined;
  const bar = new SingleBar({
    stream: process.stderr,
    format: 'importing [{bar}] {percentage}% | {rows} rows | {rate} rows/s',
    noTTYOutput: true,
    notTTYSchedule: 1_000,
    hideCursor: true,
  });
  const summary: ImportSummary = { file, organizationId, rows: 0, created: 0, updated: 0, skipped: 0, merged: 0, warnings: 0, seconds: 0, rowsPerSecond: 0 };
  const problems: string[] = [];
  const started = performance.now();
  try {
    if (orm && organizationId && !(await organizationExists(orm.em.fork(), organizationId))) throw new NotFoundError(`no organization ${organizationId}`);

    let missingEmail = false;
    let sawHeader = false;
    let headerLength = 0;
    const open = (onChunk?: (chunk: Buffer) => void) => {
      const input = createReadStream(file);
      if (onChunk) input.on('data', (chunk) => onChunk(chunk as Buffer));
      return input.pipe(
        parse(
          importCsvOptions((columns) => {
            sawHeader = true;
            if (!columns.includes('email')) missingEmail = true;
            headerLength = columns.length;
            return columns;
          }),
        ),
      );
    };
    // A first pass that only parses, its bytes checked as they go: a file that is not UTF-8 or
    // is broken (an unclosed quote, say) is refused with one line naming the problem before
    // anything is imported. Parsing is a small part of an import's cost (bench/README.md).
    const utf8 = utf8Check(file);
    // The line the last whole row ended on: a quote that never closes opened in the row after it.
    let lastRowLine = 1;
    try {
      for await (const { info } of open((chunk) => utf8.feed(chunk)) as AsyncIterable<{ info: { lines: number } }>) {
        lastRowLine = info.lines;
        if (missingEmail) break;
      }
    } catch (error) {
      throw utf8.problem() ?? brokenFile(file, error, lastRowLine + 1);
    }
    // Bytes that are not UTF-8 explain a header the parser misread: said first.
    const notUtf8Yet = utf8.problem();
    if (notUtf8Yet) throw notUtf8Yet;
    if (missingEmail || !sawHeader) {
      throw new AppError(422, 'invalid_csv', `${file} ${sawHeader ? 'has no email column' : 'is empty'} (its first line must name the columns); nothing was imported`);
    }
    const notUtf8 = utf8.problem(true);
    if (notUtf8) throw notUtf8;

    const parser = open();
    bar.start(size, 0, { rows: 0, rate: 0 });
    let batch: ImportRow[] = [];
    // Through the API the records go as read (the API parses them again), with their bytes.
    let records: Record<string, string>[] = [];
    let recordBytes = 0;
    const resubscribe = !values['no-resubscribe'];
    const flush = async () => {
      if (batch.length === 0) return;
      const result: BatchResult & Partial<RecordsResult> =
        orm && organizationId
          ? await importBatch(orm.em.fork(), organizationId, batch, { resubscribe, now: new Date() })
          : ((await callApi(target!, 'POST', '/api/v2/subscribers/import', { records, resubscribe })) as RecordsResult);
      summary.created += result.created;
      summary.updated += result.updated;
      summary.merged += result.merged;
      // The API reads the records as this command did: what it skips, this command skipped.
      summary.skipped += result.skipped?.length ?? 0;
      batch = [];
      records = [];
      recordBytes = 0;
    };
    const full = () => (orm ? batch.length >= BATCH_SIZE : batch.length >= API_BATCH_SIZE || recordBytes >= API_BATCH_BYTES);
    for await (const { record, info } of parser as AsyncIterable<{ record: Record<string, string>; info: { lines: number; error?: Error } }>) {
      summary.rows++;
      const parsed = parseImportRecord(record);
      if ('error' in parsed) {
        summary.skipped++;
        if (problems.length < SHOWN_PROBLEMS) problems.push(`line ${info.lines}: ${parsed.error}`);
      } else {
        const warnings = [...parsed.warnings];
        // More cells than the header names: the extra ones have no column to go to.
        const got = Number(/got (\d+)/.exec(info.error?.message ?? '')?.[1] ?? 0);
        if (got > headerLength) warnings.push(`${got} fields but the header names ${headerLength}: the last ${got - headerLength} ignored`);
        summary.warnings += warnings.length;
        for (const warning of warnings) if (problems.length < SHOWN_PROBLEMS) problems.push(`line ${info.lines}: ${warning}`);
        batch.push(parsed.row);
        if (!orm) {
          records.push(record);
          recordBytes += Buffer.byteLength(JSON.stringify(record));
        }
      }
      if (full()) {
        await flush();
        const seconds = (performance.now() - started) / 1000;
        bar.update(parser.info.bytes, { rows: summary.rows, rate: Math.round(summary.rows / seconds) });
      }
    }
    await flush();
    summary.seconds = Math.round((performance.now() - started)) / 1000;
    summary.rowsPerSecond = Math.round(summary.rows / Math.max(summary.seconds, 0.001));
    bar.update(size, { rows: summary.rows, rate: summary.rowsPerSecond });
    bar.stop();
  } catch (error) {
    bar.stop();
    throw error;
  } finally {
    await orm?.close(true);
  }

  for (const problem of problems) process.stderr.write(`${problem}\n`);
  if (values.json) {
    process.stdout.write(`${JSON.stringify(summary)}\n`);
  } else {
    process.stdout.write(
      `Imported ${file} into ${organizationId ?? "the token's organization"}: ${summary.rows} rows in ${summary.seconds} s (${summary.rowsPerSecond} rows/s): ` +
        `${summary.created} created, ${summary.updated} updated, ${summary.skipped} skipped, ${summary.merged} merged into an earlier row of their address, ${summary.warnings} warnings.\n`,
    );
  }
}

/**
 * Checks the bytes of a pass over the file: UTF-8, or UTF-16 with its byte-order mark (which
 * the CSV parser reads as such). Anything else (a Latin-1 export, say) would be stored with
 * replacement characters for its accented letters: `problem()` is then the refusal, naming
 * the line of the first byte that is not UTF-8.
 */
function utf8Check(file: string) {
  const decoder = new TextDecoder('utf-8', { fatal: true });
  let started = false;
  let utf16 = false;
  let line = 1;
  let found: AppError | undefined;
  const refuse = (chunk?: Buffer) => {
    // The text before the first bad byte, read leniently, says which line it is on.
    // A chunk may start inside a character the previous one began (valid, checked already):
    // its continuation bytes are skipped, not counted as the bad byte at the chunk's start.
    let start = 0;
    while (chunk && start < 3 && start < chunk.length && (chunk[start]! & 0xc0) === 0x80) start++;
    const text = chunk ? new TextDecoder('utf-8').decode(chunk.subarray(start)) : '';
    const bad = text.indexOf('\uFFFD');
    if (bad > 0) line += text.slice(0, bad).split('\n').length - 1;
    found = new AppError(422, 'invalid_csv', `${file} is not UTF-8 (near line ${line}): save it as UTF-8 and import it again; nothing was imported`);
  };
  return {
    feed(chunk: Buffer): void {
      if (found || utf16) return;
      if (!started) {
        started = true;
        // UTF-16LE with its byte-order mark: the one UTF-16 the CSV parser reads (not BE,
        // whose FE FF is no UTF-8 and is refused as such below).
        utf16 = chunk.length >= 2 && chunk[0] === 0xff && chunk[1] === 0xfe;
        if (utf16) return;
        if (chunk.length >= 2 && chunk[0] === 0xfe && chunk[1] === 0xff) {
          found = new AppError(422, 'invalid_csv', `${file} is UTF-16 big-endian: save it as UTF-8 (or UTF-16 little-endian) and import it again; nothing was imported`);
          return;
        }
      }
      try {
        decoder.decode(chunk, { stream: true });
      } catch {
        refuse(chunk);
        return;
      }
      for (let at = chunk.indexOf(10); at !== -1; at = chunk.indexOf(10, at + 1)) line++;
    },
    /** The refusal, if a byte fed so far (`ended`: and the file's end) is not UTF-8. */
    problem(ended = false): AppError | undefined {
      if (ended && !found && !utf16) {
        try {
          decoder.decode();
        } catch {
          refuse();
        }
      }
      return found;
    },
  };
}

/**
 * A file csv-parse cannot read, as one line. A quote never closed is reported where it
 * opened (`rowLine`, the line its row starts on): the parser names the file's last line.
 */
function brokenFile(file: string, error: unknown, rowLine: number): Error {
  if (error instanceof CsvError && error.code === 'CSV_QUOTE_NOT_CLOSED') {
    return new AppError(422, 'invalid_csv', `${file} is not a valid CSV file: Quote Not Closed: the row starting at line ${rowLine} opens a quote that is never closed; nothing was imported`);
  }
  if (error instanceof CsvError || error instanceof CsvHeaderError) return new AppError(422, 'invalid_csv', `${file} is not a valid CSV file: ${error.message}; nothing was imported`);
  return error instanceof Error ? error : new Error(String(error));
}

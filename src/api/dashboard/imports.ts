import { randomBytes } from 'node:crypto';
import { parse } from 'csv-parse/sync';
import { redisKey, type Services } from '../../shared/container.js';
import { ValidationError } from '../../shared/errors.js';
import { importBatch, importCsvOptions, parseImportRecord, type ImportRow } from '../../shared/subscribers/import.js';

// The upload limit of the dashboard's CSV import; larger files go through the CLI.
export const IMPORT_MAX_BYTES = 10 * 1024 * 1024;
// Rows per transaction, as the CLI's import.
const BATCH_SIZE = 2_000;
// The progress of an import is kept this long after it started.
const PROGRESS_TTL_SECONDS = 24 * 3600;
const SHOWN_PROBLEMS = 20;

export interface ImportProgress {
  organizationId: string;
  state: 'running' | 'done' | 'failed';
  total: number;
  done: number;
  created: number;
  updated: number;
  skipped: number;
  /** Rows folded into an earlier row of their address (as the CLI counts them). */
  merged: number;
  problems: string[];
  error?: string;
}

/**
 * Reads the whole upload before anything is written: a file that is not CSV, or has no
 * email column, is refused with one line naming the problem and changes nothing.
 */
export function parseCsvUpload(content: Buffer): { rows: ImportRow[]; skipped: number; problems: string[] } {
  const fail = (message: string) => new ValidationError(`file: ${message}`, [{ path: 'file', message }]);
  if (content.length === 0) throw fail('the file is empty');
  if (content.includes(0)) throw fail('this is not a CSV file (it holds binary data)');
  const text = new TextDecoder('utf-8', { fatal: false }).decode(content);
  if (text.includes('\uFFFD')) throw fail('this is not a CSV file in UTF-8');
  let records: Array<{ record: Record<string, string>; info: { lines: number } }>;
  try {
    records = parse(text, importCsvOptions()) as typeof records;
  } catch (error) {
    throw fail(`this is not a valid CSV file (${(error as Error).message.split('\n')[0]})`);
  }
  if (records.length === 0) throw fail('the file has a header line and no rows');
  if (!('email' in records[0]!.record)) throw fail('the CSV file has no email column (the first line must name the columns)');
  const rows: ImportRow[] = [];
  const problems: string[] = [];
  let skipped = 0;
  for (const { record, info } of records) {
    const parsed = parseImportRecord(record);
    if ('error' in parsed) {
      skipped++;
      if (problems.length < SHOWN_PROBLEMS) problems.push(`line ${info.lines}: ${parsed.error}`);
    } else {
      rows.push(parsed.row);
      for (const warning of parsed.warnings) if (problems.length < SHOWN_PROBLEMS) problems.push(`line ${info.lines}: ${warning}`);
    }
  }
  return { rows, skipped, problems };
}

/**
 * CSV imports started from the dashboard run in the API process, in batches, and record
 * their progress in Redis so that any API process can show it. Each batch is an upsert:
 * an import cut short by a restart can be uploaded again.
 */
export class ImportTracker {
  private readonly running = new Set<Promise<void>>();

  constructor(private readonly services: Services) {}

  private key(id: string): string {
    return redisKey(this.services.config, 'dashboard', 'import', id);
  }

  private async save(id: string, progress: ImportProgress): Promise<void> {
    await this.services.redis.set(this.key(id), JSON.stringify(progress), 'EX', PROGRESS_TTL_SECONDS);
  }

  async get(organizationId: string, id: string): Promise<ImportProgress | null> {
    if (!/^imp_[0-9a-f]{24}$/.test(id)) return null;
    const value = await this.services.redis.get(this.key(id));
    const progress = value ? (JSON.parse(value) as ImportProgress) : null;
    // Another organization's import is as unknown as a missing one.
    return progress && progress.organizationId === organizationId ? progress : null;
  }

  async start(organizationId: string, parsed: ReturnType<typeof parseCsvUpload>, options: { resubscribe: boolean }): Promise<string> {
    const id = `imp_${randomBytes(12).toString('hex')}`;
    const progress: ImportProgress = {
      organizationId,
      state: 'running',
      total: parsed.rows.length + parsed.skipped,
      done: parsed.skipped,
      created: 0,
      updated: 0,
      skipped: parsed.skipped,
      merged: 0,
      problems: parsed.problems,
    };
    await this.save(id, progress);
    const run = this.run(id, progress, parsed.rows, options).finally(() => this.running.delete(run));
    this.running.add(run);
    return id;
  }

  private async run(id: string, progress: ImportProgress, rows: ImportRow[], options: { resubscribe: boolean }): Promise<void> {
    try {
      for (let i = 0; i < rows.length; i += BATCH_SIZE) {
        const batch = rows.slice(i, i + BATCH_SIZE);
        const result = await importBatch(this.services.orm.em.fork(), progress.organizationId, batch, { ...options, now: this.services.clock() });
        progress.created += result.created;
        progress.updated += result.updated;
        progress.merged += result.merged;
        progress.done += batch.length;
        await this.save(id, progress);
      }
      progress.state = 'done';
    } catch (error) {
      this.services.logger.error({ err: error, importId: id }, 'dashboard CSV import failed');
      progress.state = 'failed';
      progress.error = 'The import stopped on an internal error; the rows before it are saved. Upload the file again to finish it.';
    }
    await this.save(id, progress).catch(() => {});
  }

  /** Lets running imports finish before the process closes its connections. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.running]);
  }
}

import { readdir, readFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from './helpers/process.js';

/**
 * Process state lives in the services container (src/shared/container.ts), made once per
 * Services and passed down, so that tests and two apps in one process never share it. A
 * module-level `let`, or a Map/Set/cache at module level, is state outside it. The ones
 * below are constants: filled once where they are declared and never changed after.
 */
const IMMUTABLE: Record<string, string> = {
  'src/shared/verification/lists.ts:FREE_PROVIDERS': 'a fixed list',
  'src/shared/verification/lists.ts:PINNED_PROVIDERS': 'a fixed list',
  'src/shared/verification/lists.ts:PRIVACY_ALIAS_DOMAINS': 'a fixed list',
  'src/shared/verification/lists.ts:SUSPICIOUS_TLDS': 'a fixed list',
  'src/shared/verification/lists.ts:RESERVED_DOMAINS': 'a fixed list',
  'src/shared/verification/lists.ts:RESERVED_TLDS': 'a fixed list',
  'src/shared/verification/lists.ts:TEST_LOCAL_PARTS': 'a fixed list',
  'src/shared/verification/lists.ts:ROLE_LOCAL_PARTS': 'a fixed list',
  'src/shared/verification/typos.ts:COM_TYPOS': 'a fixed list',
  'src/shared/dependency-errors.ts:CONNECTION_CODES': 'a fixed list',
  'src/shared/emails/transport.ts:THROTTLE_CODES': 'a fixed list',
  'src/shared/emails/queries.ts:JSONB': 'a fixed list of columns',
  'src/shared/emails/render.ts:STYLED_TAGS': 'the keys of a constant',
  'src/shared/emails/render.ts:VOID_OR_OPTIONAL': 'a fixed list',
  'src/shared/db/orm.ts:CONCURRENT_MIGRATION': 'a fixed list',
  'src/shared/bounces/report.ts:DAEMON_LOCAL_PARTS': 'a fixed list',
  'src/shared/bounces/report.ts:PLAIN_ENCODINGS': 'a fixed list',
  'src/shared/bounces/report.ts:STATUS_TYPES': 'a fixed list',
  'src/shared/bounces/report.ts:RETURNED_TYPES': 'a fixed list',
  'src/shared/domains/verification.ts:REQUIRED': 'a fixed list',
  'src/shared/outcomes/tracking-html.ts:RAW_TEXT': 'a fixed list',
  'src/shared/outcomes/tracking-html.ts:RAW_TEXT_ENDS': 'one compiled regex a tag of RAW_TEXT, made at load',
  'src/shared/campaigns/maily.ts:ALIGN': 'a fixed list',
  'src/shared/submission/message.ts:REPLACED_HEADERS': 'a fixed list',
  'src/api/dashboard/index.ts:PUBLIC_PATHS': 'a fixed list',
  'src/api/routes/campaigns.ts:KNOWN': 'the keys of a schema',
  'src/shared/campaigns/service.ts:ZONE_NAMES': "the runtime's zone names by lower-cased name, made at load",
  // Memos of pure transforms: the same input gives the same output whatever the app or its
  // configuration, so sharing them across a process is harmless.
  'src/shared/db/sql.ts:numbered': 'the same memo, where the data-access helper moves it',
  'src/shared/emails/dkim-sign.ts:parsedKeys': 'memo of PEM -> KeyObject',
};

// A `let`; a Map, Set, cache, store, pool, client...; an empty array or object (filled at run
// time: a queue of waiters).
const MUTABLE = /^(?:export\s+)?(?:let|var)\s+(\w+)|^(?:export\s+)?const\s+(\w+)[^=]*(?:=>[^=]*)*=\s*(?:new\s+(?:Map|WeakMap|Set|WeakSet|\w*(?:Cache|Store|Pool|Limiter|Recorder|Writer|Client|Batcher|Tracker|Queue|Worker))\b|\[\]|\{\})/;

async function sourceFiles(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true });
  const files = await Promise.all(
    entries.map((e) => (e.isDirectory() ? sourceFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [])),
  );
  return files.flat();
}

/** `file:name` of every module-level `let`/`var` and Map/Set/cache in src/. */
async function moduleLevelState(root = ROOT): Promise<string[]> {
  const found: string[] = [];
  for (const file of await sourceFiles(join(root, 'src'))) {
    const lines = (await readFile(file, 'utf8')).split('\n');
    for (const line of lines) {
      const match = MUTABLE.exec(line);
      if (match) found.push(`${relative(root, file)}:${match[1] ?? match[2]}`);
    }
  }
  return found;
}

describe('process state (src/shared/container.ts)', () => {
  it('has no module-level let, Map, Set or cache in src/ outside the allowlist of constants', async () => {
    const outside = (await moduleLevelState()).filter((entry) => !(entry in IMMUTABLE));
    // Move it into Services (made by createServices, or on first read) and pass it down; or,
    // if it is a constant filled where it is declared, add it to IMMUTABLE with the reason.
    expect(outside).toEqual([]);
  });

  it('would catch one', () => {
    expect(MUTABLE.exec('let cache: Map<string, string> | undefined;')?.[1]).toBe('cache');
    expect(MUTABLE.exec('const stores = new WeakMap<Services, DeliveryStore>();')?.[2]).toBe('stores');
    expect(MUTABLE.exec('export const keys: LRUCache<string, Buffer> = new LRUCache({ max: 10 });')?.[2]).toBe('keys');
    expect(MUTABLE.exec('const defaultCache = new DkimKeyCache();')?.[2]).toBe('defaultCache');
    expect(MUTABLE.exec('const waiters: (() => void)[] = [];')?.[2]).toBe('waiters');
    expect(MUTABLE.exec('  let local = 0;')).toBeNull();
    expect(MUTABLE.exec('const NAMES = [\'a\', \'b\'] as const;')).toBeNull();
  });
});

import { readFile } from 'node:fs/promises';
import pg from 'pg';
import { insertEmails } from '../src/shared/emails/accept.js';
import type { NewEmail } from '../src/shared/emails/input.js';
import { newId } from '../src/shared/ids.js';
import { cpuMsOf, createBenchEnv, fmt } from './harness.js';

// `npm run bench:ingest-sql`: where PostgreSQL's CPU goes per accepted email. The write
// path's INSERT runs on one connection in a loop, and the CPU time of that connection's
// backend (from /proc, PostgreSQL runs on this host) is divided by the rows written, for
// several statement sizes (1 row = a lone send, 20 = a group commit under load, 100 = a
// batch) and with each index or constraint of the `emails` table dropped in turn. Ratios
// against the full table in the same run are what to read.
const ROWS = Number(process.env.BENCH_ROWS ?? 20_000);
// BENCH_PREPARED=0: parse and plan every statement (as before the statement was named).
let PREPARED = process.env.BENCH_PREPARED !== '0';

const bench = await createBenchEnv('ingestsql');
const client = new pg.Client({ connectionString: bench.env.DATABASE_URL });
await client.connect();
const [{ pid }] = (await client.query<{ pid: number }>('select pg_backend_pid() as pid')).rows;

const cpuMs = () => cpuMsOf(pid);

const email = (i: number): NewEmail => ({
  organizationId: bench.organizationId,
  source: 'api',
  from: 'Acme <hello@acme.test>',
  to: `user${i}@example.com`,
  subject: 'Your receipt',
  contentKind: 'markdown',
  content: '# Thanks for your order\n\nYour receipt **#1234** is attached to your account. [View it](https://acme.test/r/1234).',
  tags: [{ name: 'kind', value: 'receipt' }],
});
// The service's statements use `?` placeholders (as `Sql` in src/shared/db/sql.ts).
const sql = {
  query: async (text: string, values?: readonly unknown[], name?: string) => {
    let n = 0;
    const pgText = text.replace(/\?/g, () => `$${++n}`);
    return (await client.query(PREPARED && name ? { name, text: pgText, values: values as unknown[] } : { text: pgText, values: values as unknown[] })).rows;
  },
};

/** µs of backend CPU a row, writing ROWS rows `perStatement` at a time. */
async function measure(perStatement: number): Promise<number> {
  const inputs = Array.from({ length: perStatement }, (_, i) => email(i));
  const before = await cpuMs();
  for (let done = 0; done < ROWS; done += perStatement) await insertEmails(sql, inputs, inputs.map(() => newId('eml')));
  const spent = (await cpuMs()) - before;
  // cascade: the tables that reference emails (email_submissions, ...) are empty here.
  await client.query('truncate emails cascade');
  return (spent * 1000) / ROWS;
}

type Variant = { name: string; undo?: string; redo?: string };
const variants: Variant[] = [
  { name: 'the table as migrated' },
  // The foreign key migration 20261125015000 replaced with a trigger on organizations.
  { name: 'with the organization foreign key', undo: 'alter table emails add constraint emails_organization_id_fkey foreign key (organization_id) references organizations (id) on delete cascade deferrable initially deferred', redo: 'alter table emails drop constraint emails_organization_id_fkey' },
  { name: 'without emails_api_list_idx', undo: 'drop index emails_api_list_idx', redo: `create index emails_api_list_idx on emails (organization_id, id) where source = 'api'` },
  {
    name: 'without emails_api_recipient_address_idx',
    undo: 'drop index if exists emails_api_recipient_address_idx',
    redo: `create index if not exists emails_api_recipient_address_idx on emails (organization_id, email_bare_address(to_address), id) where source = 'api'`,
  },
  { name: 'without emails_pending_idx', undo: 'drop index emails_pending_idx', redo: `create index emails_pending_idx on emails (id) where status in ('queued', 'sending')` },
  { name: 'synchronous_commit off', undo: 'set synchronous_commit = off', redo: 'set synchronous_commit = on' },
  { name: 'parsed and planned every time', undo: 'select 1', redo: 'select 1' },
];

try {
  const sizes = [1, 20, 100];
  // Warm the caches and the plans.
  await measure(20);
  console.log(`${ROWS} rows a measurement; PostgreSQL backend CPU µs a row (ratio to the table as migrated)`);
  console.log(`${'variant'.padEnd(40)} ${sizes.map((s) => `${s} a statement`.padStart(22)).join('')}`);
  let baseline: number[] = [];
  for (const v of variants) {
    if (v.undo) await client.query(v.undo);
    if (v.name === 'parsed and planned every time') PREPARED = false;
    const figures: number[] = [];
    for (const s of sizes) figures.push(await measure(s));
    if (v.redo) await client.query(v.redo);
    if (!v.undo) baseline = figures;
    console.log(`${v.name.padEnd(40)} ${figures.map((f, i) => `${fmt(f, 1)} (${fmt(f / baseline[i]!, 2)})`.padStart(22)).join('')}`);
  }
  const [load] = (await readFile('/proc/loadavg', 'utf8')).split(' ');
  console.log(`load average at the end: ${load} (2 cores)`);
} finally {
  await client.end();
  await bench.dispose();
}

import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process';
import { readdir, readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { loadConfig, type Config } from '../src/shared/config.js';
import { closeServices, createServices, type Services } from '../src/shared/container.js';
import { initOrm, migrate } from '../src/shared/db/orm.js';
import { createLogger } from '../src/shared/logger.js';
import { insertEmails } from '../src/shared/emails/service.js';
import { clickToken, openToken } from '../src/shared/outcomes/tokens.js';
import { createOrganization } from '../src/shared/organizations/service.js';
import { createRedis } from '../src/shared/redis.js';
import pg from 'pg';

/** A database and Redis prefix of the benchmark's own, dropped at the end. */
export interface BenchEnv {
  env: Record<string, string>;
  config: Config;
  services: Services;
  token: string;
  organizationId: string;
  dispose(): Promise<void>;
}

function dbUrl(name: string): string {
  const url = new URL(process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/mailroom');
  url.pathname = `/${name}`;
  return url.toString();
}

async function admin(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: dbUrl('postgres') });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

export async function createBenchEnv(name: string, overrides: Record<string, string> = {}): Promise<BenchEnv> {
  const dbName = `mailroom_bench_${name}_${process.pid}`;
  await admin(`drop database if exists "${dbName}" with (force)`);
  await admin(`create database "${dbName}"`);
  const env: Record<string, string> = {
    NODE_ENV: 'production',
    SECRET_KEY: 'bench-secret-key-bench-secret-key-0123456789',
    DATABASE_URL: dbUrl(dbName),
    REDIS_URL: process.env.REDIS_URL || 'redis://127.0.0.1:6379',
    REDIS_PREFIX: `mrbench-${name}-${process.pid}`,
    LOG_LEVEL: 'warn',
    // Benchmarks measure throughput, not the per-token limit.
    RATE_LIMIT_PER_SECOND: '100000000',
    ALLOW_UNVERIFIED_DOMAINS: 'true',
    ...overrides,
  };
  const config = loadConfig(env);
  const orm = await initOrm({ databaseUrl: config.databaseUrl, poolSize: 1 });
  await migrate(orm);
  await orm.close(true);
  const services = await createServices(config, createLogger({ level: 'warn', name: 'bench' }));
  const created = await createOrganization(services.orm.em.fork(), services.box, { name: 'Bench', verifyQuota: 1000 });
  return {
    env,
    config,
    services,
    token: created.token.token,
    organizationId: created.organization.id,
    async dispose() {
      await closeServices(services);
      await admin(`drop database if exists "${dbName}" with (force)`);
      const redis = createRedis(config.redisUrl, 'worker');
      let cursor = '0';
      do {
        const [next, keys] = await redis.scan(cursor, 'MATCH', `${config.redisPrefix}:*`, 'COUNT', 1000);
        cursor = next;
        if (keys.length) await redis.del(...keys);
      } while (cursor !== '0');
      redis.disconnect();
    },
  };
}

/** Runs a script of the service (`src/...`) as a child process with the bench environment. */
let built = false;

export async function spawnService(
  script: string,
  env: Record<string, string>,
  readyUrl?: string,
  // detached: a process group of its own (bench:kill SIGKILLs the group); quiet: no output.
  options: { detached?: boolean; quiet?: boolean } = {},
): Promise<ChildProcess> {
  // BENCH_PROFILE=dir writes a V8 CPU profile of the child there (open in Chrome DevTools).
  const profile = process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE}`] : [];
  // Services run as production runs them: compiled by `npm run build` and started by node
  // (`dist/…`); BENCH_TSX=1 runs the TypeScript sources through tsx instead.
  if (!process.env.BENCH_TSX && !built) {
    execFileSync(process.execPath, ['scripts/ensure-build.mjs'], { stdio: 'inherit' });
    built = true;
  }
  const entry = process.env.BENCH_TSX ? ['--import', 'tsx', script] : [script.replace(/^src\//, 'dist/').replace(/\.ts$/, '.js')];
  // BENCH_NODE_FLAGS: extra node flags for the services (e.g. `--heap-prof`, heap limits).
  const flags = process.env.BENCH_NODE_FLAGS ? process.env.BENCH_NODE_FLAGS.split(/\s+/).filter(Boolean) : [];
  const child = spawn(process.execPath, [...profile, ...flags, ...entry], {
    env: { ...process.env, ...env },
    stdio: options.quiet ? 'ignore' : ['ignore', 'inherit', 'inherit'],
    detached: options.detached,
  });
  if (readyUrl) {
    const started = Date.now();
    for (;;) {
      try {
        const res = await fetch(readyUrl);
        if (res.ok) break;
      } catch {
        // not listening yet
      }
      if (Date.now() - started > 30_000) throw new Error(`${script} did not start`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return child;
}

export async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  await new Promise<void>((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

/**
 * A helper script of bench/ (`./smtp-sink-process.ts`, `./webhook-receiver-process.ts`) in a
 * process of its own, so it does not share a core with what is measured: forked through tsx
 * with an IPC channel; it reports its URL first, then answers the messages it is sent.
 */
export interface HelperProcess {
  proc: ChildProcess;
  url: string;
  /** Sends `what` and resolves with the first reply that has `key`. */
  ask<T>(what: string, key: string): Promise<T>;
  stop(): void;
}

export async function startHelperProcess(script: string): Promise<HelperProcess> {
  const proc = fork(new URL(script, import.meta.url).pathname, [], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const url = await new Promise<string>((resolve, reject) => {
    proc.once('message', (m: { url: string }) => resolve(m.url));
    proc.once('exit', (code) => reject(new Error(`${script} exited (${code}) before reporting its URL`)));
  });
  return {
    proc,
    url,
    ask: <T>(what: string, key: string) =>
      new Promise<T>((resolve) => {
        const onMessage = (m: Record<string, unknown>) => {
          if (!(key in m)) return;
          proc.off('message', onMessage);
          resolve(m[key] as T);
        };
        proc.on('message', onMessage);
        proc.send(what);
      }),
    stop: () => {
      if (proc.connected) proc.send('stop');
    },
  };
}

/** The local SMTP sink (bench/smtp-sink-process.ts) and the messages it accepted so far. */
export async function startSinkProcess(): Promise<HelperProcess & { count(): Promise<number> }> {
  const sink = await startHelperProcess('./smtp-sink-process.ts');
  return { ...sink, count: () => sink.ask<number>('count', 'count') };
}

/** The fields of /proc/PID/stat after the command (which may hold spaces), and the command. */
function statOf(text: string): { command: string; fields: string[] } {
  const close = text.lastIndexOf(') ');
  return { command: text.slice(text.indexOf(' (') + 2, close), fields: text.slice(close + 2).split(' ') };
}

/**
 * CPU time (user + system, ms) a process has used: fields 14 and 15 of /proc/PID/stat, in
 * clock ticks of 10 ms; 0 once it has exited.
 */
export async function cpuMsOf(pid: number): Promise<number> {
  try {
    const { fields } = statOf(await readFile(`/proc/${pid}/stat`, 'utf8'));
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return 0;
  }
}

/**
 * CPU time (ms) used by every process whose command is `command` (`postgres`, `redis-server`),
 * including the children they have reaped (fields 16 and 17): PostgreSQL's exited backends
 * count in the postmaster's. A difference of two readings is what they spent in between.
 */
export async function cpuMsOfCommand(command: string): Promise<number> {
  let ms = 0;
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const text = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    if (!text) continue;
    const stat = statOf(text);
    if (stat.command !== command) continue;
    ms += (Number(stat.fields[11]) + Number(stat.fields[12]) + Number(stat.fields[13]) + Number(stat.fields[14])) * 10;
  }
  return ms;
}

/** Resident set size (bytes) of a process: VmRSS of /proc/PID/status; 0 once it has exited. */
export async function rssOf(pid: number): Promise<number> {
  return readFile(`/proc/${pid}/status`, 'utf8').then((s) => Number(/VmRSS:\s+(\d+)/.exec(s)?.[1] ?? 0) * 1024, () => 0);
}

/** The middle of `values` (the mean of the two middle ones when their count is even). */
export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

export const fmt = (n: number, digits = 0) => n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

/**
 * `count` emails of the benchmark's organization marked sent, to `reader{i}@example.com`
 * from news@bench.test, with `content` as HTML and `{id}@bench.test` as Message-ID: their ids.
 */
export async function seedSentEmails(bench: BenchEnv, count: number, content: string): Promise<string[]> {
  const { services } = bench;
  const ids = await insertEmails(
    services.orm.em.fork(),
    Array.from({ length: count }, (_, i) => ({
      organizationId: bench.organizationId,
      from: 'news@bench.test',
      to: `reader${i}@example.com`,
      subject: 'Bench',
      contentKind: 'html' as const,
      content,
    })),
  );
  await services.orm.em.fork().execute(`update emails set status = 'sent', message_id = id || '@bench.test', sent_at = now() where id in (select jsonb_array_elements_text(?::jsonb))`, [JSON.stringify(ids)], 'run');
  return ids;
}

/**
 * `count` sent emails of the benchmark's organization, each with one tracked link: the
 * paths of their open pixels and click redirects (tracking benchmarks).
 */
export async function seedTrackedEmails(bench: BenchEnv, count: number): Promise<{ opens: string[]; clicks: string[] }> {
  const { signer } = bench.services;
  const ids = await seedSentEmails(bench, count, '<p><a href="https://bench.test/offer">offer</a></p>');
  return {
    opens: ids.map((id) => `/t/o/${openToken(signer, id)}.gif`),
    clicks: ids.map((id) => `/t/c/${clickToken(signer, id, 0, 'https://bench.test/offer?utm_source=mailroom&utm_medium=email')}`),
  };
}

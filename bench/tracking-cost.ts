/**
 * `npm run bench:tracking-cost`: the CPU a tracking hit costs, measured rather than timed
 * (throughput on a shared machine moves with its load). The API runs in this process;
 * autocannon runs in a child process and sends a fixed number of requests (BENCH_HITS,
 * default 100,000) to `GET /healthz`, the open pixel and the click redirect in turn,
 * BENCH_ROUNDS times (default 3). For each route it prints the API process's CPU per
 * request (process.cpuUsage, including the recorder's writes, which are waited for; GC
 * time from perf_hooks) and the CPU of the PostgreSQL backends serving the benchmark's
 * database (from /proc), per request. BENCH_PROFILE=DIR writes a V8 CPU profile of the API
 * process per route and round to DIR.
 */
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { PerformanceObserver } from 'node:perf_hooks';
import { startApi } from '../src/api/server.js';
import { createBenchEnv, seedTrackedEmails } from './harness.js';

const HITS = Number(process.env.BENCH_HITS ?? 100_000);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 20);
const EMAILS = 500;
const TICK_MS = 10; // USER_HZ = 100 on Linux
let gcMs = 0;
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) gcMs += entry.duration;
}).observe({ entryTypes: ['gc'] });

function procCpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) * TICK_MS;
  } catch {
    return 0;
  }
}

const LOADER = `
const autocannon = require('autocannon');
const { root, paths, amount, connections } = JSON.parse(process.argv[1]);
autocannon({ url: root, connections, amount, requests: paths.map((path) => ({ method: 'GET', path })) }, (err, r) => {
  if (err) throw err;
  process.stdout.write(JSON.stringify({ ok: r['2xx'] + r['3xx'], bad: r.errors + r.timeouts + r.non2xx - r['3xx'], rps: r.requests.average }));
});`;

async function load(root: string, paths: string[], amount: number): Promise<{ ok: number; bad: number; rps: number }> {
  const child = spawn(process.execPath, ['-e', LOADER, JSON.stringify({ root, paths, amount, connections: CONNECTIONS })], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.on('data', (chunk) => (out += chunk));
  await new Promise((resolve) => child.on('exit', resolve));
  return JSON.parse(out);
}

async function main(): Promise<void> {
  const bench = await createBenchEnv('trackcost', { NODE_ENV: 'test', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'silent' });
  const { services } = bench;
  const dbName = new URL(bench.config.databaseUrl).pathname.slice(1);
  try {
    const { opens, clicks } = await seedTrackedEmails(bench, EMAILS);
    const app = await startApi(services);
    const { port } = app.server.address() as { port: number };
    const root = `http://127.0.0.1:${port}`;

    const count = async () => {
      const [row] = await services.orm.em.fork().execute<{ n: number }[]>('select count(*)::int as n from email_events', [], 'all');
      return row!.n;
    };
    const backends = async () => {
      const rows = await services.orm.em.fork().execute<{ pid: number }[]>(`select pid from pg_stat_activity where datname = ?`, [dbName], 'all');
      return rows.map((r) => r.pid);
    };
    const pgCpu = (pids: number[]) => pids.reduce((a, pid) => a + procCpuMs(pid), 0);

    let session: Session | undefined;
    if (process.env.BENCH_PROFILE) {
      session = new Session();
      session.connect();
      await session.post('Profiler.enable');
      await session.post('Profiler.setSamplingInterval', { interval: 200 });
    }

    console.log(`tracking cost — ${HITS} requests a route, ${CONNECTIONS} connections, Node ${process.version}`);
    const routes: Array<[string, string[], boolean]> = [
      ['healthz', ['/healthz'], false],
      ['open', opens, true],
      ['click', clicks, true],
    ];
    // Warm-up (JIT, pools, first opens/clicks), not measured.
    for (const [, paths] of routes) await load(root, paths, 20_000);
    const settle = async (expected: number) => {
      for (let i = 0; i < 400 && (await count()) < expected; i++) await new Promise((r) => setTimeout(r, 25));
    };
    let expected = await count();
    const totals = routes.map(() => ({ ok: 0, bad: 0, api: 0, user: 0, sys: 0, pg: 0, gc: 0, wall: 0 }));
    const rounds = Number(process.env.BENCH_ROUNDS ?? 3);
    for (let round = 0; round < rounds; round++) {
      for (const [r, [name, paths, counts]] of routes.entries()) {
        await settle(expected);
        const pids = await backends();
        if (session) await session.post('Profiler.start');
        const pg0 = pgCpu(pids);
        const gc0 = gcMs;
        const cpu0 = process.cpuUsage();
        const t0 = performance.now();
        const result = await load(root, paths, HITS);
        if (counts) expected += result.ok;
        await settle(expected);
        const cpu = process.cpuUsage(cpu0);
        const t = totals[r]!;
        t.wall += performance.now() - t0;
        t.pg += pgCpu(pids) - pg0;
        t.gc += gcMs - gc0;
        t.ok += result.ok;
        t.bad += result.bad;
        t.user += cpu.user / 1000;
        t.sys += cpu.system / 1000;
        if (session) {
          const { profile } = await session.post('Profiler.stop');
          mkdirSync(process.env.BENCH_PROFILE!, { recursive: true });
          writeFileSync(`${process.env.BENCH_PROFILE}/${name}-${round}.cpuprofile`, JSON.stringify(profile));
        }
      }
    }
    const base = (totals[0]!.user + totals[0]!.sys) / totals[0]!.ok;
    for (const [r, [name]] of routes.entries()) {
      const t = totals[r]!;
      const us = (ms: number) => ((ms * 1000) / t.ok).toFixed(1);
      const api = (t.user + t.sys) / t.ok;
      console.log(
        `${name.padEnd(8)} ${t.ok} ok ${t.bad} bad, ${Math.round((t.ok * 1000) / t.wall)} req/s: API ${us(t.user + t.sys)} µs/req ` +
          `(user ${us(t.user)}, sys ${us(t.sys)}, GC ${us(t.gc)}; ${((base / api) * 100).toFixed(0)}% of healthz's), PostgreSQL ${us(t.pg)} µs/req`,
      );
    }
    await app.close();
    const recorded = await count();
    console.log(`events recorded ${recorded}, expected at least ${expected}`);
  } finally {
    await bench.dispose();
  }
}

await main();

import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createBenchEnv, fmt, freePort, median } from './harness.js';

// `npm run bench:startup`: start time and idle RSS of the api and the worker, run from the
// TypeScript sources through tsx (how `npm start` ran before the production build) against
// the compiled dist/ (how it runs now), alternately, BENCH_ROUNDS times each.
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const IDLE_MS = 5_000;

if (spawnSync(process.execPath, ['scripts/ensure-build.mjs'], { stdio: 'inherit' }).status !== 0) throw new Error('build failed');
const bench = await createBenchEnv('startup');

const ROLES = {
  api: { ts: 'src/api/server.ts', js: 'dist/api/server.js', ready: /listening at http/ },
  worker: { ts: 'src/workers/main.ts', js: 'dist/workers/main.js', ready: /workers started/ },
} as const;

async function once(role: keyof typeof ROLES, mode: 'tsx' | 'node'): Promise<{ startMs: number; rssMiB: number }> {
  const entry = mode === 'tsx' ? ROLES[role].ts : ROLES[role].js;
  const args = mode === 'tsx' ? ['--import', 'tsx', entry] : [entry];
  const port = await freePort();
  const t0 = performance.now();
  const child = spawn(process.execPath, args, { env: { ...process.env, ...bench.env, PORT: String(port), LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const ready = new Promise<number>((resolve, reject) => {
    const check = (c: Buffer) => {
      out += c.toString();
      if (ROLES[role].ready.test(out)) resolve(performance.now() - t0);
    };
    child.stdout.on('data', check);
    child.stderr.on('data', check);
    child.once('exit', () => reject(new Error(`${entry} exited:\n${out}`)));
  });
  const startMs = await ready;
  await new Promise((r) => setTimeout(r, IDLE_MS));
  const rssKiB = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'))?.[1] ?? 0);
  child.removeAllListeners('exit');
  await new Promise((resolve) => {
    child.once('exit', resolve);
    child.kill('SIGTERM');
  });
  return { startMs, rssMiB: rssKiB / 1024 };
}

try {
  for (const role of ['api', 'worker'] as const) {
    const runs: Record<'tsx' | 'node', Array<{ startMs: number; rssMiB: number }>> = { tsx: [], node: [] };
    for (let i = 0; i < ROUNDS; i += 1) for (const mode of ['tsx', 'node'] as const) runs[mode].push(await once(role, mode));
    const s = (mode: 'tsx' | 'node') => ({ start: median(runs[mode].map((r) => r.startMs)), rss: median(runs[mode].map((r) => r.rssMiB)) });
    const before = s('tsx');
    const after = s('node');
    console.log(
      `${role.padEnd(7)} start ${fmt(before.start)} ms -> ${fmt(after.start)} ms (ratio ${fmt(after.start / before.start, 2)}); ` +
        `idle RSS ${fmt(before.rss, 1)} MiB -> ${fmt(after.rss, 1)} MiB (ratio ${fmt(after.rss / before.rss, 2)}) [median of ${ROUNDS}, tsx src -> node dist]`,
    );
  }
  console.log(`load average at the end: ${readFileSync('/proc/loadavg', 'utf8').split(' ')[0]} (2 cores)`);
} finally {
  await bench.dispose();
}

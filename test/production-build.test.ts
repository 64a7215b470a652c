import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestEnv, type TestEnv } from './helpers/context.js';
import { ROOT } from './helpers/process.js';

let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv();
});
afterAll(async () => env?.dispose());

/** The command lines of a process and all its descendants (from /proc). */
function tree(pid: number): string[] {
  const children = (readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean)).map(Number);
  const self = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
  return [self, ...children.flatMap((child) => tree(child))];
}

/**
 * Runs `main` with node alone (no TypeScript loader) from a temporary folder holding the files
 * `files(folder)` gives; its stdout. A blocking call ignores vitest's timeout: a child that
 * never exits (a handle opened at import) fails the test at 30 s instead of hanging the run.
 */
function runScript(files: (folder: string) => Record<string, string>, main: string): string {
  const folder = mkdtempSync(join(tmpdir(), 'mailroom-build-'));
  try {
    for (const [name, text] of Object.entries(files(folder))) writeFileSync(join(folder, name), text);
    return execFileSync(process.execPath, [join(folder, main)], { cwd: ROOT, encoding: 'utf8', env: { PATH: process.env.PATH ?? '' }, timeout: 30_000 });
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
}

describe('npm start runs the compiled build (README.md "Running in production")', () => {
  /** `npm start`, once it says it is running: the child (npm, leader of its process group), its output and its address. */
  async function npmStart() {
    // Build is fresh: the test run's global setup ran scripts/ensure-build.mjs.
    const child = spawn('npm', ['start'], {
      cwd: ROOT,
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env.env, PORT: '0', LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    const run = { child, output: '', base: '', exited: new Promise<number | null>((resolve) => child.once('exit', resolve)) };
    child.stdout.on('data', (c: Buffer) => (run.output += c.toString()));
    child.stderr.on('data', (c: Buffer) => (run.output += c.toString()));
    const started = Date.now();
    while (!/mailroom is running on http:\/\/127\.0\.0\.1:\d+/.test(run.output)) {
      if (Date.now() - started > 80_000 || child.exitCode !== null) throw new Error(`did not start:\n${run.output}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    run.base = /mailroom is running on (http:\/\/127\.0\.0\.1:\d+)/.exec(run.output)![1]!;
    return run;
  }

  /** Stops what a failed test left running (the whole process group). */
  async function cleanUp(run: Awaited<ReturnType<typeof npmStart>> | undefined) {
    if (!run || run.child.exitCode !== null || run.child.signalCode !== null) return;
    try {
      process.kill(-run.child.pid!, 'SIGKILL');
    } catch {
      // already gone
    }
    await run.exited;
  }

  it('`ps` of `npm start` shows node dist/main.js and no tsx; SIGTERM to npm alone stops it gracefully', { timeout: 90_000 }, async () => {
    let run: Awaited<ReturnType<typeof npmStart>> | undefined;
    try {
      run = await npmStart();
      const commands = tree(run.child.pid!);
      expect(commands.some((c) => /node(\S*)? dist\/main\.js$/.test(c)), commands.join('\n')).toBe(true);
      expect(commands.filter((c) => c.includes('tsx'))).toEqual([]);
      expect((await fetch(`${run.base}/healthz`)).status).toBe(200);
      // SIGTERM to npm alone (a plain `kill`, systemd's KillMode=process) reaches node: it stops
      // gracefully and npm exits with its code, leaving no node behind.
      process.kill(run.child.pid!, 'SIGTERM');
      expect(await run.exited).toBe(0);
      expect(run.output).toMatch(/stopped/);
      const base = run.base;
      await expect.poll(() => fetch(`${base}/healthz`).then(() => 'listening', () => 'gone'), { timeout: 10_000 }).toBe('gone');
    } finally {
      await cleanUp(run);
    }
  });

  it('SIGTERM to the process group (Ctrl-C, Heroku, systemd) stops it gracefully too: node gets it twice, from the kernel and from npm', { timeout: 90_000 }, async () => {
    let run: Awaited<ReturnType<typeof npmStart>> | undefined;
    try {
      run = await npmStart();
      process.kill(-run.child.pid!, 'SIGTERM');
      expect(await run.exited).toBe(0);
      expect(run.output).toMatch(/stopped/);
      expect(run.output).not.toMatch(/second signal/);
    } finally {
      await cleanUp(run);
    }
  });

  it('compiles every file of src/ (a new process role is picked up without a change to the build)', () => {
    const listed = execFileSync(process.execPath, [`${ROOT}node_modules/typescript/bin/tsc`, '-p', `${ROOT}tsconfig.build.json`, '--listFilesOnly'], { encoding: 'utf8' });
    const sources = listed.split('\n').filter((f) => f.startsWith(`${ROOT}src/`));
    expect(sources).toContain(`${ROOT}src/main.ts`);
    expect(sources).toContain(`${ROOT}src/cli/main.ts`);
    expect(sources.length).toBeGreaterThan(100);
    expect(JSON.parse(readFileSync(`${ROOT}package.json`, 'utf8')).scripts).toMatchObject({
      start: 'exec node dist/main.js',
      'start:api': 'exec node dist/api/server.js',
      'start:worker': 'exec node dist/workers/main.js',
      'start:inbound': 'exec node dist/inbound/main.js',
      'start:smtp': 'exec node dist/smtp/main.js',
    });
  });

  it('renders and builds in the compiled render threads with node alone (no TypeScript loader)', { timeout: 60_000 }, () => {
    // The API renders campaign test sends in worker threads, and a worker's delivery thread
    // renders and builds (its modules imported on first use); their entry must be compiled too.
    const script = `
      const { RenderPool } = await import(${JSON.stringify(`${ROOT}dist/shared/emails/render-pool.js`)});
      const pool = new RenderPool({ threads: 1, timeoutMs: 20000 });
      const out = await pool.email({ contentKind: 'markdown', content: '# Hello from a thread', subject: 'S', preview: null, text: null });
      const built = await pool.answer({ kind: 'compose', mail: { from: 'a@acme.test', to: 'b@example.com', subject: 'Built in a thread', text: 'Hi' } });
      await pool.close();
      const ok = out.html.includes('Hello from a thread') && built.ok && Buffer.from(built.value.raw).toString().includes('Subject: Built in a thread');
      process.stdout.write(ok ? 'rendered' : 'wrong');`;
    expect(runScript(() => ({ 'render.mjs': script }), 'render.mjs')).toBe('rendered');
  });

  it("a serving process's compiled modules leave out the migrator, mailparser and the country names (docs/operations.md \"Memory\")", { timeout: 60_000 }, () => {
    // What each role's entry imports, without starting it (each starts only as the main module):
    // the files loaded as ES modules (a loader hook writes each one's URL to a file) and those
    // loaded by require() (require.cache). The SMTP submission listener parses every message
    // with mailparser: it keeps it.
    const unused = ['/@mikro-orm/migrations/', '/mailparser/', '/i18n-iso-countries/langs/'];
    const roles: [string, string[]][] = [
      ['dist/api/server.js', unused],
      ['dist/workers/main.js', unused],
      ['dist/inbound/main.js', unused],
      ['dist/smtp/main.js', unused.filter((part) => part !== '/mailparser/')],
    ];
    const hooks = `import { appendFileSync } from 'node:fs';
      let file;
      export function initialize(data) { file = data.file; }
      export async function load(url, context, next) { appendFileSync(file, url + '\\n'); return next(url, context); }`;
    for (const [entry, absent] of roles) {
      const output = runScript(
        (folder) => ({
          'hooks.mjs': hooks,
          'esm.txt': '',
          'modules.mjs': `
            import { createRequire, register } from 'node:module';
            import { readFileSync } from 'node:fs';
            register(${JSON.stringify(pathToFileURL(join(folder, 'hooks.mjs')).href)}, { data: { file: ${JSON.stringify(join(folder, 'esm.txt'))} } });
            await import(${JSON.stringify(`${ROOT}${entry}`)});
            const loaded = [...Object.keys(createRequire(import.meta.url).cache), ...readFileSync(${JSON.stringify(join(folder, 'esm.txt'))}, 'utf8').split('\\n').filter(Boolean)];
            process.stdout.write(JSON.stringify(loaded));
            process.exit(0);`,
        }),
        'modules.mjs',
      );
      const loaded = JSON.parse(output) as string[];
      // The check sees both kinds: the ORM (CommonJS) and the service's own files (ES modules).
      expect(loaded.some((path) => path.includes('/@mikro-orm/core/')), entry).toBe(true);
      expect(loaded.some((path) => path.startsWith('file://') && path.includes('/dist/shared/container.js')), entry).toBe(true);
      for (const part of absent) expect(loaded.filter((path) => path.includes(part)), `${entry} loads ${part}`).toEqual([]);
    }
  });
});

#!/usr/bin/env node
// Compiles src/ to dist/ (tsconfig.build.json) when dist/ is missing or older than a file of
// src/, so `npm install && npm start` works on a fresh clone and after a `git pull`, while
// the processes themselves run plain `node dist/...` (no TypeScript at run time).
//
// Without TypeScript installed (a production install, `npm ci --omit=dev`) it never builds:
// an existing dist/ is used as it is, and a missing one is a one-line error.
// Messages go to stderr only: `npm run --silent cli -- ... --json` keeps its stdout clean.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const stamp = join(root, 'dist', '.build-stamp');
const inputs = [join(root, 'src'), join(root, 'tsconfig.json'), join(root, 'tsconfig.build.json'), join(root, 'package-lock.json')];

function newest(path) {
  if (!existsSync(path)) return 0;
  const stat = statSync(path);
  if (!stat.isDirectory()) return stat.mtimeMs;
  let latest = stat.mtimeMs;
  for (const entry of readdirSync(path)) latest = Math.max(latest, newest(join(path, entry)));
  return latest;
}

const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0;
const stale = built === 0 || inputs.some((input) => newest(input) > built);
const quiet = process.argv.includes('--if-possible');

let tsc;
try {
  tsc = createRequire(join(root, 'package.json')).resolve('typescript/bin/tsc');
} catch {
  tsc = undefined;
}

// Nothing to build from (e.g. a Docker layer that installs dependencies before the sources).
if (!existsSync(join(root, 'src'))) process.exit(0);
if (!stale) process.exit(0);
if (!tsc) {
  if (built) process.exit(0); // a production image: dist/ was built where TypeScript was
  if (quiet) process.exit(0); // `npm ci --omit=dev` without dist/: `npm start` will say so
  process.stderr.write('mailroom: dist/ is missing and TypeScript is not installed: run `npm install` (with dev dependencies) or `npm run build`\n');
  process.exit(1);
}

process.stderr.write('mailroom: compiling src/ to dist/ ...\n');
const result = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { cwd: root, stdio: ['ignore', 2, 2] });
if (result.status !== 0) {
  process.stderr.write('mailroom: the build failed (see above)\n');
  process.exit(result.status ?? 1);
}
writeFileSync(stamp, `${new Date().toISOString()}\n`);

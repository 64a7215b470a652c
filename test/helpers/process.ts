import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface ServiceProcess {
  child: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** Resolves with the first match of `pattern` in stdout + stderr, or rejects after `timeoutMs`. */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  /** Resolves with the exit code (or the signal's name) once the process has ended. */
  exited: Promise<number | string>;
  /** Sends SIGKILL if it still runs (cleanup after a failed assertion). */
  kill(): void;
}

/**
 * The node arguments that run an entry: a source of the service (`src/….ts`) as its compiled
 * file (`dist/….js`), as the package.json scripts run it; any other file (a test fixture)
 * through tsx. Compiled, a process starts on half the CPU. The test run's global setup builds
 * dist/ when a source changed: in watch mode (`npx vitest`) it runs once, so restart the
 * watcher after changing the service's sources.
 */
export function nodeArgs(entry: string): string[] {
  const source = /^(?:\.\/)?src\/(.*)\.ts$/.exec(entry);
  return source ? [`dist/${source[1]}.js`] : ['--import', 'tsx', entry];
}

/**
 * Runs an entry of the service (`src/...`, run compiled: `nodeArgs`) as its own process, one
 * node process (as the package.json scripts run `node dist/...`: a signal reaches the service
 * itself), with exactly `env` (plus PATH and HOME) as its environment.
 */
export function runService(
  entry: string,
  args: string[],
  env: Record<string, string>,
): ServiceProcess {
  const fullEnv = { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env };
  const child = spawn(process.execPath, [...nodeArgs(entry), ...args], { cwd: ROOT, env: fullEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  const waiters = new Set<() => void>();
  const notify = () => waiters.forEach((w) => w());
  child.stdout?.on('data', (chunk: Buffer) => {
    out += chunk.toString();
    notify();
  });
  child.stderr?.on('data', (chunk: Buffer) => {
    err += chunk.toString();
    notify();
  });
  const exited = new Promise<number | string>((resolve) => {
    child.on('exit', (code, signal) => {
      resolve(code ?? signal ?? -1);
      notify();
    });
  });
  let done = false;
  void exited.then(() => (done = true));

  return {
    child,
    stdout: () => out,
    stderr: () => err,
    exited,
    kill() {
      if (!done) child.kill('SIGKILL');
    },
    waitFor(pattern, timeoutMs = 20_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const match = (out + err).match(pattern);
          if (match) {
            cleanup();
            resolve(match);
          } else if (done) {
            cleanup();
            reject(new Error(`process exited before printing ${pattern}:\n${out}\n${err}`));
          }
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`timed out waiting for ${pattern}:\n${out}\n${err}`));
        }, timeoutMs);
        const cleanup = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
  };
}

/** Runs a command of the CLI to its end. */
export async function runCli(args: string[], env: Record<string, string>): Promise<{ code: number | string; stdout: string; stderr: string }> {
  const proc = runService('src/cli/main.ts', args, env);
  const code = await proc.exited;
  return { code, stdout: proc.stdout(), stderr: proc.stderr() };
}

/** A TCP port nothing listens on (taken from the OS, then released). */
export async function closedPort(): Promise<number> {
  const { createServer } = await import('node:net');
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

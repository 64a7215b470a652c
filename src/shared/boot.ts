import { inspect } from 'node:util';
import { setFlagsFromString } from 'node:v8';
import { ConfigError, loadConfig, type Config } from './config.js';
import { createLogger, type Logger } from './logger.js';
import { resolveSecretKey } from './secret-key.js';
import { StartupError } from './startup.js';

/** Parses the environment or stops the process with a message naming each bad variable. */
export function bootConfig(name: string): { config: Config; logger: Logger } {
  let config: Config;
  let warning: string | undefined;
  try {
    const resolved = resolveSecretKey(loadConfig());
    config = resolved.config;
    warning = resolved.warning;
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`mailroom: ${error.message}\n`);
      process.exit(1);
    }
    throw error;
  }
  limitHeapGrowth(config.heapGrowingPercent);
  const logger = createLogger({ level: config.logLevel, name });
  if (warning) logger.warn(warning);
  const local = localPublicUrl(config);
  if (local) logger.warn(local);
  return { config, logger };
}

/**
 * A production process whose PUBLIC_URL names this machine (unset: localhost): the DNS
 * records a sending domain asks for (SPF, the return path's MX), the links in every email and
 * the return path of mail from other domains would point at it, and nothing else would say so.
 */
export function localPublicUrl(config: Pick<Config, 'nodeEnv' | 'publicUrl'>): string | undefined {
  if (config.nodeEnv !== 'production') return undefined;
  const host = new URL(config.publicUrl).hostname.replace(/^\[|\]$/g, '').replace(/\.$/, '').toLowerCase();
  if (host !== 'localhost' && !host.endsWith('.localhost') && !/^127\./.test(host) && host !== '::1' && host !== '0.0.0.0') return undefined;
  return `PUBLIC_URL is ${config.publicUrl}: set it to the service's public address, or the DNS records of sending domains and the links in emails name ${host}`;
}

/**
 * How far V8 lets the heap grow between major collections: a fixed factor of 1 + percent/100
 * of the live heap instead of V8's own, which lets a busy process collect up to about three
 * times its live heap in garbage (docs/operations.md "Memory"). Unlike a heap limit
 * (`--max-old-space-size`) it caps nothing: a burst of large messages makes the heap grow, it
 * cannot end the process out of memory. V8 reads the flag at every collection, so setting it
 * at boot is as good as on node's command line. 0 leaves V8 its own heuristic (and a
 * `--heap-growing-percent` given to node by hand) untouched.
 */
export function limitHeapGrowth(percent: number): void {
  if (percent > 0) setFlagsFromString(`--heap-growing-percent=${percent}`);
}

// Longer than a send's own timeouts (the relay's answer, a lock wait), shorter than what an
// orchestrator usually grants before SIGKILL.
const SHUTDOWN_DEADLINE_MS = 25_000;

export interface Shutdown {
  /** How to stop once started; a signal received during start-up runs it right away. */
  onStop(stop: () => Promise<void>): void;
}

/**
 * A start-up problem that names its setting (a port in use, a file that cannot be read) is
 * told in one line, as a configuration error is; any other uncaught error as node tells it.
 * Installed once, by a process's entry point (handleShutdown): never in a library or a test.
 */
function exitOnStartupError(): void {
  if (process.listeners('uncaughtException').includes(exitOnUncaught)) return;
  process.on('uncaughtException', exitOnUncaught);
}

function exitOnUncaught(error: Error): void {
  process.stderr.write(error instanceof StartupError ? `mailroom: ${error.message}\n` : `${inspect(error)}\n`);
  process.exit(1);
}

// Under npm, a repeat of the first signal within this long is the same signal delivered twice
// (handleShutdown): npm passes its own on within milliseconds; a person's second Ctrl-C comes later.
const REPEAT_MS = 300;

/**
 * Installs the SIGINT and SIGTERM handlers (and the start-up error exit) at once, before start-up: a signal that comes
 * while the process is still starting (connecting, migrating) is remembered, and the process
 * stops gracefully as soon as it has started, instead of dying of the signal. `stop` runs
 * once, then the process exits 0 (1 if `stop` fails). A second signal exits at once (under npm,
 * the same signal within REPEAT_MS is the first one passed on again, not a second), and so
 * does a stop still unfinished after SHUTDOWN_DEADLINE_MS (a job or a close waiting on
 * PostgreSQL or Redis that is gone): what it leaves behind is what a killed process leaves,
 * which the reconcilers recover (docs/operations.md "Killing a process").
 */
export function handleShutdown(logger: Logger, options: { deadlineMs?: number } = {}): Shutdown {
  exitOnStartupError();
  const deadlineMs = options.deadlineMs ?? SHUTDOWN_DEADLINE_MS;
  // Only npm (`npm start`, `npm run start:*`, which exec node) passes on a signal the process group got too.
  const repeatMs = process.env.npm_lifecycle_event ? REPEAT_MS : 0;
  let stopping = false;
  let requested: NodeJS.Signals | undefined;
  let first: { signal: NodeJS.Signals; at: number } | undefined;
  let stopFn: (() => Promise<void>) | undefined;
  const run = (signal: NodeJS.Signals, stop: () => Promise<void>) => {
    stopping = true;
    logger.info({ signal }, 'shutting down: finishing requests and active jobs');
    stop().then(
      () => {
        logger.info('stopped');
        process.exit(0);
      },
      (error: unknown) => {
        logger.error({ err: error }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  const handler = (signal: NodeJS.Signals) => {
    if (stopping || requested) {
      // The same signal again at once is one signal delivered twice, not a person insisting:
      // `npm start` execs node, so a signal to the process group reaches node from the kernel
      // and again from npm, which passes its own on.
      if (first && first.signal === signal && performance.now() - first.at < repeatMs) return;
      logger.warn({ signal }, 'second signal: exiting now');
      process.exit(1);
    }
    first = { signal, at: performance.now() };
    // From the first signal, whether the process has finished starting or not (one that
    // waits for Redis may never finish).
    setTimeout(() => {
      logger.error({ deadlineMs }, 'shutdown did not finish in time: exiting now');
      process.exit(1);
    }, deadlineMs).unref();
    if (stopFn) run(signal, stopFn);
    else {
      requested = signal;
      logger.info({ signal }, 'signal received while starting: stopping once started');
    }
  };
  process.on('SIGINT', handler);
  process.on('SIGTERM', handler);
  return {
    onStop(stop) {
      stopFn = stop;
      if (requested && !stopping) run(requested, stop);
    },
  };
}

/** Runs `stop` once on SIGINT or SIGTERM, then exits (see handleShutdown). */
export function onShutdown(logger: Logger, stop: () => Promise<void>): void {
  handleShutdown(logger).onStop(stop);
}

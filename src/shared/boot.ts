import { ConfigError, loadConfig, type Config } from './config.js';
import { createLogger, type Logger } from './logger.js';

/** Parses the environment or stops the process with a message naming each bad variable. */
export function bootConfig(name: string): { config: Config; logger: Logger } {
  let config: Config;
  try {
    config = loadConfig();
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`mailroom: ${error.message}\n`);
      process.exit(1);
    }
    throw error;
  }
  const logger = createLogger({ level: config.logLevel, name });
  if (config.usingDevelopmentSecret) {
    logger.warn('SECRET_KEY is not set: using the development key. Set SECRET_KEY before handling real mail.');
  }
  return { config, logger };
}

/**
 * Runs `stop` once on SIGINT or SIGTERM, then exits. A second signal exits at once.
 */
export function onShutdown(logger: Logger, stop: () => Promise<void>): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.warn({ signal }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    logger.info({ signal }, 'shutting down: finishing requests and active jobs');
    stop().then(
      () => process.exit(0),
      (error: unknown) => {
        logger.error({ err: error }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', handler);
  process.on('SIGTERM', handler);
}

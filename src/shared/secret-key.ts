import { randomBytes } from 'node:crypto';
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { ConfigError, type Config } from './config.js';

const MIN_LENGTH = 32;

/**
 * The SECRET_KEY of an install that has none (outside production, where it is required):
 * a random key generated on first start and kept in SECRET_KEY_FILE (mode 0600), the same
 * for every process of the install and across restarts. It signs public links and
 * encrypts DKIM keys and token secrets: a key known to everyone (the former development
 * key) made an exposed development instance forgeable. Returns the config to run with and
 * the warning to log.
 */
export function resolveSecretKey(config: Config): { config: Config; warning?: string; created?: boolean } {
  if (!config.usingDevelopmentSecret || config.nodeEnv === 'production') return { config };
  const file = config.secretKeyFile;
  let key = read(file);
  let created = false;
  if (key === undefined) {
    try {
      mkdirSync(dirname(file), { recursive: true });
      // `wx`: two processes starting at once cannot both write; the second reads the first's key.
      writeFileSync(file, `${randomBytes(48).toString('base64url')}\n`, { mode: 0o600, flag: 'wx' });
      created = true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') {
        throw new ConfigError([`SECRET_KEY_FILE: cannot create ${file} (${(error as Error).message}); set SECRET_KEY or a writable SECRET_KEY_FILE`]);
      }
    }
    key = read(file);
  } else {
    // Only the service's user may read it, even if it was copied in with other permissions.
    try {
      chmodSync(file, 0o600);
    } catch {
      // Not our file to change (read-only mount): it is used as it is.
    }
  }
  if (key === undefined || key.length < MIN_LENGTH) {
    throw new ConfigError([`SECRET_KEY_FILE: ${file} must hold a key of at least ${MIN_LENGTH} characters`]);
  }
  return {
    config: { ...config, secretKey: key, usingDevelopmentSecret: false },
    created,
    warning: `SECRET_KEY is not set: using the key ${created ? 'generated in' : 'kept in'} ${file}. Keep that file (it signs links and encrypts secrets); set SECRET_KEY in production.`,
  };
}

function read(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8').trim();
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new ConfigError([`SECRET_KEY_FILE: cannot read ${file} (${(error as Error).message})`]);
  }
}

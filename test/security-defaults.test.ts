import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEVELOPMENT_SECRET_KEY, loadConfig } from '../src/shared/config.js';
import { SecretBox } from '../src/shared/crypto.js';
import { resolveSecretKey } from '../src/shared/secret-key.js';
import { createTestEnv, type TestEnv } from './helpers/context.js';
import { bootConfig } from '../src/shared/boot.js';

/** Safe defaults (docs/security.md). */
const dir = join(tmpdir(), `mailroom-secret-${randomBytes(4).toString('hex')}`);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('SECRET_KEY outside production', () => {
  let env: TestEnv;
  beforeAll(async () => {
    env = await createTestEnv();
  });
  afterAll(async () => env?.dispose());

  it('is generated at random on first start, kept 0600, and the same on the next start', () => {
    const file = join(dir, 'unit', 'secret-key');
    const first = resolveSecretKey(loadConfig({ NODE_ENV: 'development', SECRET_KEY_FILE: file }));
    expect(first.config.secretKey).not.toBe(DEVELOPMENT_SECRET_KEY);
    expect(first.config.secretKey.length).toBeGreaterThanOrEqual(32);
    expect(first.config.usingDevelopmentSecret).toBe(false);
    expect(first.warning).toMatch(/SECRET_KEY is not set/);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const second = resolveSecretKey(loadConfig({ NODE_ENV: 'development', SECRET_KEY_FILE: file }));
    expect(second.config.secretKey).toBe(first.config.secretKey);
    // Another install (another data directory) gets another key.
    const other = resolveSecretKey(loadConfig({ NODE_ENV: 'development', SECRET_KEY_FILE: join(dir, 'other', 'secret-key') }));
    expect(other.config.secretKey).not.toBe(first.config.secretKey);
  });

  it('a given SECRET_KEY is used as it is, and no file is written', () => {
    const file = join(dir, 'given', 'secret-key');
    const resolved = resolveSecretKey(loadConfig({ SECRET_KEY: 'k'.repeat(40), SECRET_KEY_FILE: file }));
    expect(resolved.config.secretKey).toBe('k'.repeat(40));
    expect(() => statSync(file)).toThrow();
  });

  it('the processes\' start-up (bootConfig) uses the generated key', () => {
    const file = join(dir, 'boot', 'secret-key');
    const saved = { ...process.env };
    try {
      for (const name of ['SECRET_KEY', 'NODE_ENV']) delete process.env[name];
      Object.assign(process.env, { ...env.env, NODE_ENV: 'development', LOG_LEVEL: 'silent', SECRET_KEY_FILE: file });
      delete process.env.SECRET_KEY;
      const { config } = bootConfig('security-test');
      const key = readFileSync(file, 'utf8').trim();
      expect(config.secretKey).toBe(key);
      expect(key).not.toBe(DEVELOPMENT_SECRET_KEY);
      expect(statSync(file).mode & 0o777).toBe(0o600);
    } finally {
      for (const name of Object.keys(process.env)) if (!(name in saved)) delete process.env[name];
      Object.assign(process.env, saved);
    }
  });
});

describe('secrets sealed with SECRET_KEY', () => {
  it('open with the same key, and name the cause with another', () => {
    const sealed = new SecretBox('k'.repeat(40)).seal('svc_secret');
    expect(new SecretBox('k'.repeat(40)).open(sealed)).toBe('svc_secret');
    expect(() => new SecretBox('x'.repeat(40)).open(sealed)).toThrow(/sealed with another SECRET_KEY/);
  });
});

describe('docker-compose.yml', () => {
  it('does not allow unverified sending domains by default in production', () => {
    const compose = readFileSync(new URL('../docker-compose.yml', import.meta.url), 'utf8');
    expect(compose).toMatch(/NODE_ENV: production/);
    const line = compose.split('\n').find((l) => /^\s*ALLOW_UNVERIFIED_DOMAINS:/.test(l));
    expect(line).toBeDefined();
    // Neither a literal true nor a default of true (`${ALLOW_UNVERIFIED_DOMAINS:-true}`).
    expect(line).not.toMatch(/:\s*["']?(true|1|yes|on)["']?\s*$|:-(true|1|yes|on)\}/i);
  });
});

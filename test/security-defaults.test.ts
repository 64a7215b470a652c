import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEVELOPMENT_SECRET_KEY, loadConfig } from '../src/shared/config.js';
import { resolveSecretKey } from '../src/shared/secret-key.js';
import { createTestEnv, type TestEnv } from './helpers/context.js';
import { runService } from './helpers/process.js';

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

  it('the API process started without SECRET_KEY uses the generated key, with a warning', async () => {
    const file = join(dir, 'process', 'secret-key');
    const { SECRET_KEY: _unused, ...withoutKey } = env.env;
    const proc = runService('src/api/server.ts', [], { ...withoutKey, NODE_ENV: 'development', PORT: '0', LOG_LEVEL: 'info', SECRET_KEY_FILE: file });
    try {
      await proc.waitFor(/listening at http:\/\/127\.0\.0\.1:(\d+)/);
      const key = readFileSync(file, 'utf8').trim();
      expect(key.length).toBeGreaterThanOrEqual(32);
      expect(key).not.toBe(DEVELOPMENT_SECRET_KEY);
      expect(statSync(file).mode & 0o777).toBe(0o600);
      expect(proc.stdout()).toContain(`using the key generated in ${file}`);
    } finally {
      proc.kill();
    }
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

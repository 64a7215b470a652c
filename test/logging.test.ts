import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { runService } from './helpers/process.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

describe('log redaction', () => {
  it('the logger never prints authorization headers, tokens, keys or passwords', async () => {
    const secretToken = `svc_${randomBytes(32).toString('hex')}`;
    const secretKey = `key-${randomBytes(20).toString('hex')}`;
    const password = `pw-${randomBytes(8).toString('hex')}`;
    const proc = runService('test/fixtures/log-secrets.ts', [secretToken, secretKey, password], {});
    expect(await proc.exited).toBe(0);
    const output = proc.stdout() + proc.stderr();
    // Every line was written (the test would prove nothing otherwise)...
    const lines = output.trim().split('\n').map((line) => JSON.parse(line));
    expect(lines.map((l) => l.msg)).toEqual(['request', 'headers', 'authorization', 'config', 'token', 'nested', 'child', 'dkim', 'done']);
    expect(lines[3].config.databaseUrl).toBe('[redacted]');
    expect(lines[0].req.url).toBe('/api/v2/tokens');
    // ...and no secret in any of them.
    for (const secret of [secretToken, secretKey, password]) expect(output).not.toContain(secret);
  });

  it('a running API logging every request (LOG_LEVEL=trace) prints no secret', async () => {
    const secretKey = `key-${randomBytes(20).toString('hex')}`;
    const password = `pw-${randomBytes(8).toString('hex')}`;
    const proc = runService('src/api/server.ts', [], {
      ...ctx.env.env,
      PORT: '0',
      LOG_LEVEL: 'trace',
      ADMIN_PASSWORD: password,
      PROVIDER_WEBHOOK_SECRET: secretKey,
    });
    try {
      const base = `http://127.0.0.1:${(await proc.waitFor(/listening at http:\/\/127\.0\.0\.1:(\d+)/))[1]}`;
      const auth = { authorization: `Bearer ${token}` };
      const minted = (await (
        await fetch(`${base}/api/v2/tokens`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: '{"name":"logged"}' })
      ).json()) as { token: string };
      expect(minted.token).toMatch(/^svc_/);
      await fetch(`${base}/api/v2/tokens`, { headers: { authorization: `Bearer ${minted.token}` } });
      const unknown = `svc_${randomBytes(32).toString('hex')}`;
      expect((await fetch(`${base}/api/v2/tokens`, { headers: { authorization: `Bearer ${unknown}` } })).status).toBe(401);
      await fetch(`${base}/api/v2/tokens`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: '{bad' });

      proc.child.kill('SIGTERM');
      expect(await proc.exited).toBe(0);
      const output = proc.stdout() + proc.stderr();
      expect(output).toContain('incoming request');
      expect(output).toMatch(/"reqId":"[0-9a-f-]{36}"/);
      for (const secret of [token, minted.token, unknown, ctx.env.env.SECRET_KEY, secretKey, password]) {
        expect(output).not.toContain(secret);
      }
    } finally {
      proc.kill();
    }
  });
});

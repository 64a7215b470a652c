import { createHmac, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from './helpers/context.js';
import { runService } from './helpers/process.js';

const SECRET = 'provider-webhook-secret';
let ctx: TestContext;

beforeAll(async () => {
  ctx = await createTestContext({ PROVIDER_WEBHOOK_SECRET: SECRET });
});
afterAll(async () => ctx?.close());

const hmac = (text: string) => `sha256=${createHmac('sha256', SECRET).update(text).digest('hex')}`;

function webhook(body: string, headers: Record<string, string>) {
  return ctx.app.inject({ method: 'POST', url: '/webhooks/provider', headers: { 'content-type': 'application/json', ...headers }, payload: body });
}

describe('provider webhook timestamp (docs/security.md)', () => {
  // No email has this Message-ID: an accepted event answers 404, a refused one 401.
  const body = JSON.stringify({ type: 'delivered', messageId: '<nobody@example.test>' });
  const seconds = () => Math.floor(Date.now() / 1000);

  it('accepts a fresh timestamped event signed over `<timestamp>.<body>`', async () => {
    const stamp = String(seconds());
    expect((await webhook(body, { 'x-mailroom-timestamp': stamp, 'x-mailroom-signature': hmac(`${stamp}.${body}`) })).statusCode).toBe(404);
  });

  it('refuses a correctly signed event older than 10 minutes (a replay)', async () => {
    const stamp = String(seconds() - 11 * 60);
    const res = await webhook(body, { 'x-mailroom-timestamp': stamp, 'x-mailroom-signature': hmac(`${stamp}.${body}`) });
    expect(res.statusCode).toBe(401);
    expect(res.json()).toMatchObject({ name: 'invalid_signature' });
    expect(res.json().message).toMatch(/10 minutes/);
  });

  it('refuses a timestamp that the signature does not cover', async () => {
    const res = await webhook(body, { 'x-mailroom-timestamp': String(seconds()), 'x-mailroom-signature': hmac(body) });
    expect(res.statusCode).toBe(401);
  });

  it('keeps the format without a timestamp', async () => {
    expect((await webhook(body, { 'x-mailroom-signature': hmac(body) })).statusCode).toBe(404);
  });
});

describe('capability tokens in URLs are not logged', () => {
  it('a running API logging every request prints no unsubscribe, confirmation or tracking token', async () => {
    const proc = runService('src/api/server.ts', [], { ...ctx.env.env, PORT: '0', LOG_LEVEL: 'trace' });
    try {
      const base = `http://127.0.0.1:${(await proc.waitFor(/listening at http:\/\/127\.0\.0\.1:(\d+)/, 50_000))[1]}`;
      const tokens = Array.from({ length: 7 }, () => randomBytes(24).toString('hex'));
      // Percent-encoded paths reach the same routes (`/%75/` is `/u/`), and an API token in a
      // query string is the client's mistake, logged without it all the same.
      const apiToken = `svc_${randomBytes(32).toString('hex')}`;
      for (const path of [
        `/u/${tokens[0]}`,
        `/confirm/${tokens[1]}`,
        `/t/o/${tokens[2]}.gif`,
        `/t/c/${tokens[3]}`,
        `/%75/${tokens[4]}`,
        `/%74/o/${tokens[5]}.gif`,
        `/t/%6F/${tokens[6]}.gif`,
        `/api/v2/emails?token=${apiToken}`,
      ]) {
        await fetch(`${base}${path}`, { redirect: 'manual' });
      }
      proc.child.kill('SIGTERM');
      expect(await proc.exited).toBe(0);
      const output = proc.stdout() + proc.stderr();
      // The requests were logged (the test would prove nothing otherwise)...
      expect(output).toContain('"url":"/u/[redacted]"');
      expect(output).toContain('"url":"/t/c/[redacted]"');
      // ...and no token in any line.
      for (const token of [...tokens, apiToken]) expect(output).not.toContain(token);
    } finally {
      proc.kill();
    }
    // A process of its own: slow to start on a loaded machine.
  }, 90_000);
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from './helpers/outages.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { runCli, runService, type ServiceProcess } from './helpers/process.js';

let ctx: TestContext;

beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

async function mint(token: string, name: string): Promise<{ id: string; token: string }> {
  const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(token), payload: { name } });
  expect(res.statusCode).toBe(200);
  return res.json();
}

const status = async (token: string) => (await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(token) })).statusCode;

describe('DELETE /api/v2/tokens/{id} (docs/foundation.md "Authentication and rate limiting")', () => {
  it('deletes the token: its secret is refused at once, the others keep working', async () => {
    const { token } = await createOrg(ctx.services);
    const doomed = await mint(token, 'leaked');
    expect(await status(doomed.token)).toBe(200); // now cached by this process

    const res = await ctx.app.inject({ method: 'DELETE', url: `/api/v2/tokens/${doomed.id}`, headers: bearer(token) });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ object: 'token', id: doomed.id, deleted: true });

    const refused = await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(doomed.token) });
    expect(refused.statusCode).toBe(401);
    expect(refused.json().name).toBe('missing_api_key');
    expect(await status(token)).toBe(200);
    const listed = (await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(token) })).json();
    expect(listed.data.map((t: { id: string }) => t.id)).not.toContain(doomed.id);
  });

  it("answers 404 for another organization's token and for an unknown id, and changes nothing", async () => {
    const a = await createOrg(ctx.services, { name: 'A' });
    const b = await createOrg(ctx.services, { name: 'B' });
    const bToken = await mint(b.token, 'b-token');
    for (const id of [bToken.id, 'tok_01jz0000000000000000000000', 'nonsense']) {
      const res = await ctx.app.inject({ method: 'DELETE', url: `/api/v2/tokens/${id}`, headers: bearer(a.token) });
      expect(res.statusCode).toBe(404);
      expect(res.json()).toMatchObject({ name: 'not_found', statusCode: 404 });
    }
    expect(await status(bToken.token)).toBe(200);
  });

  it('needs the tokens permission, and a token may revoke itself', async () => {
    const { token } = await createOrg(ctx.services);
    const sending = (
      await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(token), payload: { name: 'sender', preset: 'app' } })
    ).json();
    const forbidden = await ctx.app.inject({ method: 'DELETE', url: `/api/v2/tokens/${sending.id}`, headers: bearer(sending.token) });
    expect(forbidden.statusCode).toBe(403);

    const self = await mint(token, 'self');
    const res = await ctx.app.inject({ method: 'DELETE', url: `/api/v2/tokens/${self.id}`, headers: bearer(self.token) });
    expect(res.statusCode).toBe(200);
    expect(await status(self.token)).toBe(401);
  });
});

describe('revocation reaches every API process (docs/foundation.md "Authentication and rate limiting")', () => {
  const processes: ServiceProcess[] = [];
  afterAll(() => processes.forEach((p) => p.kill()));

  async function startApi(): Promise<string> {
    const proc = runService('src/api/server.ts', [], { ...ctx.env.env, PORT: '0', LOG_LEVEL: 'info' });
    processes.push(proc);
    return `http://127.0.0.1:${(await proc.waitFor(/listening at http:\/\/127\.0\.0\.1:(\d+)/, 30_000))[1]}`;
  }

  async function refusedWithin(base: string, secret: string, ms: number): Promise<number> {
    const started = Date.now();
    while (Date.now() - started < ms) {
      const res = await fetch(`${base}/api/v2/tokens`, { headers: bearer(secret) });
      if (res.status === 401) return Date.now() - started;
      expect(res.status).toBe(200);
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`still accepted after ${ms} ms`);
  }

  it('a token revoked through one process is refused by the other within 2 s, and by the CLI too', { timeout: 60_000 }, async () => {
    const [first, second] = await Promise.all([startApi(), startApi()]);
    const { token } = await createOrg(ctx.services);
    const viaApi = await mint(token, 'via-api');
    const viaCli = await mint(token, 'via-cli');
    // Both processes have each secret in their cache now.
    for (const base of [first, second]) {
      for (const secret of [viaApi.token, viaCli.token]) {
        expect((await fetch(`${base}/api/v2/tokens`, { headers: bearer(secret) })).status).toBe(200);
      }
    }

    const res = await fetch(`${first}/api/v2/tokens/${viaApi.id}`, { method: 'DELETE', headers: bearer(token) });
    expect(res.status).toBe(200);
    expect(await refusedWithin(second, viaApi.token, 2_000)).toBeLessThan(2_000);

    const cli = await runCli(['token', 'revoke', viaCli.id, '--json'], ctx.env.env);
    expect(cli.code).toBe(0);
    expect(JSON.parse(cli.stdout)).toEqual({ object: 'token', id: viaCli.id, deleted: true, refusedWithinSeconds: 2 });
    expect(cli.stderr).toBe('');
    expect(await refusedWithin(first, viaCli.token, 2_000)).toBeLessThan(2_000);
    expect(await refusedWithin(second, viaCli.token, 2_000)).toBeLessThan(2_000);
    expect((await fetch(`${second}/api/v2/tokens`, { headers: bearer(token) })).status).toBe(200);
  });
});

describe('operator CLI: org list, token list, token revoke (docs/foundation.md "Authentication and rate limiting")', () => {
  const cli = (...args: string[]) => runCli(args, ctx.env.env);

  it('token revoke --json says when Redis was not reachable: a warning on stderr, and 30 s in the answer', async () => {
    const doomed = await mint((await createOrg(ctx.services, { name: 'Redis down' })).token, 'redis-down');
    const nothing = await freePort();
    const revoked = await runCli(['token', 'revoke', doomed.id, '--json'], { ...ctx.env.env, REDIS_URL: `redis://127.0.0.1:${nothing}` });
    expect(revoked.code).toBe(0);
    expect(JSON.parse(revoked.stdout)).toEqual({ object: 'token', id: doomed.id, deleted: true, refusedWithinSeconds: 30 });
    expect(revoked.stderr).toMatch(/Redis was not reachable/);
  });

  it('lists organizations and tokens as JSON, never a secret', async () => {
    const org = await createOrg(ctx.services, { name: 'Listed Inc' });
    const extra = await mint(org.token, 'ci');
    const orgs = await cli('org', 'list', '--json');
    expect(orgs.code).toBe(0);
    const listed = JSON.parse(orgs.stdout);
    expect(Array.isArray(listed)).toBe(true);
    expect(listed.find((o: { id: string }) => o.id === org.organizationId)).toMatchObject({ name: 'Listed Inc', tokens: 2 });

    const [tokens, human] = await Promise.all([
      cli('token', 'list', '--org', org.organizationId, '--json'),
      cli('token', 'list', '--org', org.organizationId),
    ]);
    expect(tokens.code).toBe(0);
    const rows = JSON.parse(tokens.stdout);
    expect(rows.map((t: { name: string }) => t.name)).toEqual(['ci', 'default']);
    expect(rows[0]).toEqual({ id: extra.id, name: 'ci', last4: extra.token.slice(-4), permissions: ['*'], createdAt: expect.any(String) });
    expect(tokens.stdout).not.toContain('svc_');

    expect(human.stdout).toContain(extra.id);
    expect(human.stdout).not.toContain(extra.token);
  });

  it('answers one line and changes nothing on bad input', async () => {
    const [missingOrg, unknownOrg, unknownToken, noId] = await Promise.all([
      cli('token', 'list'),
      cli('token', 'list', '--org', 'org_nope'),
      cli('token', 'revoke', 'tok_nope'),
      cli('token', 'revoke'),
    ]);
    expect(missingOrg.code).toBe(2);
    expect(missingOrg.stderr).toContain('--org');
    expect(unknownOrg.code).toBe(1);
    expect(unknownOrg.stderr.trim()).toBe('mailroom: No organization org_nope (see org list)');
    expect(unknownToken.code).toBe(1);
    expect(unknownToken.stderr.trim()).toBe('mailroom: No token tok_nope');
    expect(noId.code).toBe(2);
    expect(noId.stderr).not.toMatch(/\n\s+at /);
  });
});

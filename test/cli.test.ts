import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';
import { access, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Organization } from '../src/shared/db/entities/index.js';
import { ensureDatabase } from '../src/shared/db/orm.js';
import { bearer, createTestContext, type TestContext } from './helpers/context.js';
import { adminQuery, databaseUrl, dropDatabase } from './helpers/database.js';
import { closedPort, ROOT, runCli } from './helpers/process.js';

let ctx: TestContext;

beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const cli = (...args: string[]) => runCli(args, ctx.env.env);

async function organization(id: string): Promise<Organization | null> {
  return ctx.services.orm.em.fork().findOne(Organization, { id });
}

describe('org create (README.md "The first token and the first email")', () => {
  it('`npm run --silent cli -- org create --name Acme --json` prints exactly the contract\'s JSON, and the token works', async () => {
    const child = spawn('npm', ['run', '--silent', 'cli', '--', 'org', 'create', '--name', 'Acme', '--json'], {
      cwd: ROOT,
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...ctx.env.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    const code = await new Promise((resolve) => child.on('exit', resolve));
    expect(code).toBe(0);

    // One line, one object, keys in the contract's order.
    expect(stdout.endsWith('\n')).toBe(true);
    expect(stdout.trimEnd().split('\n')).toHaveLength(1);
    const printed = JSON.parse(stdout);
    expect(printed).toEqual({
      organization: { id: expect.stringMatching(/^org_[0-9a-z]{26}$/), name: 'Acme' },
      token: { id: expect.stringMatching(/^tok_[0-9a-z]{26}$/), token: expect.stringMatching(/^svc_[0-9a-f]{64}$/), permissions: ['*'] },
    });
    expect(stdout).toBe(
      `{"organization":{"id":"${printed.organization.id}","name":"Acme"},` +
        `"token":{"id":"${printed.token.id}","token":"${printed.token.token}","permissions":["*"]}}\n`,
    );

    const res = await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(printed.token.token) });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ object: 'list', has_more: false, data: [{ id: printed.token.id, permissions: ['*'], last4: printed.token.token.slice(-4) }] });
    const minted = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(printed.token.token), payload: { name: 'ci', preset: 'app' } });
    expect(minted.statusCode).toBe(200);
  });

  it('takes --double-opt-in and --verify-quota, and prints the token without --json', async () => {
    const { code, stdout } = await cli('org', 'create', '--name', 'Initech', '--double-opt-in', '--verify-quota', '250');
    expect(code).toBe(0);
    const secret = /svc_[0-9a-f]{64}/.exec(stdout)?.[0];
    const id = /org_[0-9a-z]{26}/.exec(stdout)?.[0];
    expect(secret).toBeDefined();
    expect(await organization(id!)).toMatchObject({ name: 'Initech', doubleOptIn: true, verifyQuota: 250, trackOpens: true, trackClicks: true });
    expect((await ctx.app.inject({ url: '/api/v2/tokens', headers: bearer(secret!) })).statusCode).toBe(200);
  });

  it('defaults the quota to VERIFY_MONTHLY_QUOTA and double opt-in to off', async () => {
    const { stdout } = await runCli(['org', 'create', '--name', 'Umbrella', '--json'], { ...ctx.env.env, VERIFY_MONTHLY_QUOTA: '42' });
    const org = await organization(JSON.parse(stdout).organization.id);
    expect(org).toMatchObject({ doubleOptIn: false, verifyQuota: 42 });
  });
});

describe('org update (README.md "The first token and the first email")', () => {
  it('changes the flags given and leaves the others', async () => {
    const id = JSON.parse((await cli('org', 'create', '--name', 'Hooli', '--json')).stdout).organization.id;
    const first = await cli('org', 'update', id, '--double-opt-in', 'on', '--verify-quota', '7', '--track-opens', 'off', '--json');
    expect(first.code).toBe(0);
    expect(JSON.parse(first.stdout)).toEqual({ id, name: 'Hooli', doubleOptIn: true, verifyQuota: 7, trackOpens: false, trackClicks: true });

    const second = await cli('org', 'update', id, '--track-clicks', 'off', '--double-opt-in', 'off', '--name', 'Hooli XYZ');
    expect(second.code).toBe(0);
    expect(second.stdout).toContain(id);
    expect(await organization(id)).toMatchObject({ name: 'Hooli XYZ', doubleOptIn: false, verifyQuota: 7, trackOpens: false, trackClicks: false });
  });

  it('exits 1 naming an unknown organization', async () => {
    const { code, stderr } = await cli('org', 'update', 'org_00000000000000000000000000', '--track-opens', 'on');
    expect(code).toBe(1);
    expect(stderr).toContain('org_00000000000000000000000000');
  });
});

describe('bad usage exits non-zero with a message', () => {
  it.for([
    [['org', 'create'], '--name'],
    [['org', 'create', '--name', 'A', '--verify-quota', 'lots'], '--verify-quota'],
    [['org', 'create', '--name', 'A', '--colour', 'red'], '--colour'],
    [['org', 'update'], 'organization id'],
    [['org', 'update', 'org_x', 'other', '--name', 'A'], 'org update takes one organization id, not "org_x other"'],
    [['org', 'create', '--name', 'A', 'extra'], 'extra'],
    [['org', 'update', 'org_x', '--track-opens', 'maybe'], '--track-opens'],
    [['org', 'create', '--name', 'A', '--verify-quota', '99999999999'], '--verify-quota'],
    [['org', 'update', 'org_x', '--name', '  '], '--name'],
    [['org', 'update', 'org_x', '--name', 'x'.repeat(101)], '--name'],
    [['migrate', 'now'], 'migrate takes no arguments'],
    [['org', 'delete', 'org_x'], 'org needs one of: create, update, list (not "delete")'],
    [['org'], 'org needs one of: create, update, list'],
    [['frobnicate'], 'unknown command: frobnicate'],
  ] as const)('%s', async ([args, mention]) => {
    const { code, stdout, stderr } = await cli(...args);
    expect(code).toBe(2);
    expect(stderr).toContain(mention);
    expect(stderr).toContain('Usage:');
    expect(stdout).toBe('');
  });

  it('prints the usage with no command, -h, or --help after a command', async () => {
    for (const args of [[], ['-h'], ['org', 'create', '--help'], ['org', 'create', '-h']]) {
      const { code, stdout } = await cli(...args);
      expect(code, args.join(' ')).toBe(0);
      expect(stdout).toContain('org create --name NAME');
    }
  });

  it('says in one line that the database cannot be reached, without a stack trace', async () => {
    const url = new URL(ctx.env.env.DATABASE_URL!);
    url.port = String(await closedPort());
    const { code, stderr } = await runCli(['org', 'list'], { ...ctx.env.env, DATABASE_URL: url.toString() });
    expect(code).toBe(1);
    expect(stderr.trim().split('\n')).toEqual([expect.stringMatching(/^mailroom: cannot reach PostgreSQL or Redis \(.*ECONNREFUSED.*\); nothing was changed$/)]);
    // A database that does not exist (a mistyped DATABASE_URL, or before `migrate`): one line too.
    const missing = new URL(ctx.env.env.DATABASE_URL!);
    missing.pathname = '/mailroom_test_no_such_database';
    const absent = await runCli(['org', 'list'], { ...ctx.env.env, DATABASE_URL: missing.toString() });
    expect(absent.code).toBe(1);
    expect(absent.stderr.trim().split('\n')).toEqual([expect.stringMatching(/^mailroom: cannot reach PostgreSQL or Redis \(.*does not exist.*\); nothing was changed$/)]);
  });
});

describe('the secret key (README.md "The first token and the first email")', () => {
  // Eight CLI processes one after the other: two minutes on a loaded machine.
  it('makes no key file for help, an unknown command or a command that needs none, and says so on stderr when a command generates one', { timeout: 120_000 }, async () => {
    const dir = await mkdtemp(join(tmpdir(), 'mailroom-cli-key-'));
    const file = join(dir, 'data', 'secret-key');
    // No SECRET_KEY, outside production: the key is the file's, generated on first use.
    const env = { ...ctx.env.env, NODE_ENV: 'development', SECRET_KEY: '', SECRET_KEY_FILE: file };
    try {
      for (const args of [['--help'], ['help'], ['org', 'delete', 'org_x'], ['constructor'], ['toString'], ['migrate']]) {
        const { code, stderr } = await runCli(args, env);
        // A name every object has is no command either.
        if (args[0] === 'constructor' || args[0] === 'toString') expect({ code, stderr: stderr.split('\n')[0] }).toEqual({ code: 2, stderr: `mailroom: unknown command: ${args[0]}` });
        await expect(access(file), args.join(' ')).rejects.toThrow();
      }
      const first = await runCli(['org', 'list', '--json'], env);
      expect(first.code).toBe(0);
      expect(first.stderr).toContain(`${file} did not exist: a new key was generated there`);
      expect(first.stderr).toContain('same SECRET_KEY');
      await access(file);
      const again = await runCli(['org', 'list', '--json'], env);
      expect(again.code).toBe(0);
      expect(again.stderr).not.toContain('generated');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('migrate', () => {
  it('creates a missing database, applies the migrations once, then says it is up to date', async () => {
    const name = `mailroom_test_cli_${randomBytes(4).toString('hex')}`;
    const env = { ...ctx.env.env, DATABASE_URL: databaseUrl(name) };
    try {
      const first = await runCli(['migrate'], env);
      expect(first.code).toBe(0);
      expect(first.stderr).toContain('created the database');
      expect(first.stderr).toMatch(/applied .*Foundation/);
      const again = await runCli(['migrate'], env);
      expect(again.code).toBe(0);
      expect(again.stderr).toContain('database is up to date');
      const org = await runCli(['org', 'create', '--name', 'Fresh', '--json'], env);
      expect(org.code).toBe(0);
    } finally {
      await dropDatabase(name);
    }
  });

  it('two runs at once on a new database both succeed (the one that collides waits and finds the migrations applied)', async () => {
    const name = `mailroom_test_cli_${randomBytes(4).toString('hex')}`;
    const env = { ...ctx.env.env, DATABASE_URL: databaseUrl(name) };
    try {
      // The database first (creating it twice at once is another race, and not this one).
      await adminQuery(`create database "${name}"`);
      const runs = await Promise.all([runCli(['migrate'], env), runCli(['migrate'], env)]);
      expect(runs.map((r) => r.code), runs.map((r) => r.stderr).join('\n')).toEqual([0, 0]);
      expect((await runCli(['migrate'], env)).stderr).toContain('database is up to date');
    } finally {
      await dropDatabase(name);
    }
  });

  it('creates a missing database once when several processes start at once (the create that loses the race is no error)', async () => {
    for (let round = 0; round < 5; round++) {
      const name = `mailroom_test_cli_${randomBytes(4).toString('hex')}`;
      try {
        const created = await Promise.all(Array.from({ length: 4 }, () => ensureDatabase(databaseUrl(name))));
        expect(created.filter(Boolean)).toHaveLength(1);
      } finally {
        await dropDatabase(name);
      }
    }
  });
});

describe('user commands against a rate-limited API (src/cli/api-client.ts)', () => {
  it('wait out a 429 for its Retry-After and go on; after five 429s they stop and say so', async () => {
    let calls = 0;
    let limitedFor = 1;
    const api = createServer((request, response) => {
      calls++;
      if (calls <= limitedFor) {
        response.writeHead(429, { 'content-type': 'application/json', 'retry-after': '1' });
        return response.end(JSON.stringify({ name: 'rate_limit_exceeded', message: 'Too many requests', statusCode: 429 }));
      }
      response.writeHead(200, { 'content-type': 'application/json' });
      response.end(JSON.stringify({ email: 'jane@example.com', result: 'deliverable' }));
    });
    await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', resolve));
    const env = { ...ctx.env.env, MAILROOM_URL: `http://127.0.0.1:${(api.address() as { port: number }).port}`, MAILROOM_TOKEN: `svc_${'1'.repeat(64)}` };
    try {
      const started = Date.now();
      const once = await runCli(['verify', 'jane@example.com', '--json'], env);
      expect(once.code, once.stderr).toBe(0);
      expect(JSON.parse(once.stdout)).toMatchObject({ result: 'deliverable' });
      expect(calls).toBe(2);
      expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);

      calls = 0;
      limitedFor = Infinity;
      const always = await runCli(['verify', 'jane@example.com'], env);
      expect(always.code).toBe(1);
      expect(always.stderr).toContain('rate_limit_exceeded');
      expect(calls).toBe(5);
    } finally {
      await new Promise((resolve) => api.close(resolve));
    }
  });
});

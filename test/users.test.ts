import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LAST_EVENTS, lastEvent } from '../src/shared/emails/last-event.js';
import { getEmail, insertEmails, listEmails } from '../src/shared/emails/service.js';
import { emailTimeline } from '../src/shared/emails/timeline.js';
import { checkPassword } from '../src/shared/users/service.js';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { nodeArgs, ROOT, runCli } from './helpers/process.js';

let ctx: TestContext;
let org: { organizationId: string };

beforeAll(async () => {
  ctx = await createTestContext();
  org = await createOrg(ctx.services);
});
afterAll(async () => ctx?.close());

/** The CLI with `input` on its stdin, as `echo PASSWORD | npm run cli -- user create ...` does. */
async function cliWithStdin(args: string[], input: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [...nodeArgs('src/cli/main.ts'), ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...ctx.env.env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  child.stdin.end(input);
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  return { code, stdout, stderr };
}

const userCount = async () => Number(((await ctx.services.orm.em.fork().execute('select count(*) as n from users')) as Array<{ n: string }>)[0]!.n);

describe('user create and user list (docs/dashboard.md "Getting in")', () => {
  it('creates a user with the password from stdin, hashed with argon2id, and lists it as JSON', async () => {
    const created = await cliWithStdin(['user', 'create', '--org', org.organizationId, '--email', ' Jane@Acme.TEST ', '--json'], 'a long passphrase\n');
    expect(created.code).toBe(0);
    const user = JSON.parse(created.stdout);
    expect(user).toEqual({ id: expect.stringMatching(/^usr_[0-9a-z]{26}$/), organizationId: org.organizationId, email: 'jane@acme.test', createdAt: expect.any(String) });
    const [row] = (await ctx.services.orm.em.fork().execute('select password_hash from users where id = ?', [user.id])) as Array<{ password_hash: string }>;
    expect(row!.password_hash).toMatch(/^\$argon2id\$/);
    expect(row!.password_hash).not.toContain('a long passphrase');
    // The trailing newline is not part of the password.
    expect(await checkPassword(ctx.services.orm.em.fork(), 'jane@acme.test', 'a long passphrase')).toMatchObject({ id: user.id });
    expect(await checkPassword(ctx.services.orm.em.fork(), 'jane@acme.test', 'a long passphrase\n')).toBeNull();

    const listed = await runCli(['user', 'list', '--org', org.organizationId, '--json'], ctx.env.env);
    expect(listed.code).toBe(0);
    expect(JSON.parse(listed.stdout)).toEqual([user]);
  });

  /**
   * `user create --email EMAIL` on a terminal of its own (script(1) runs the CLI on a
   * pseudo-terminal), `typed` into it as a person would once it asks for the password.
   */
  async function createAtTerminal(email: string, typed: string): Promise<{ code: number | null; shown: string }> {
    const command = `${process.execPath} ${nodeArgs('src/cli/main.ts').join(' ')} user create --org ${org.organizationId} --email ${email}`;
    const child = spawn('script', ['-qec', command, '/dev/null'], { cwd: ROOT, env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...ctx.env.env }, stdio: ['pipe', 'pipe', 'pipe'] });
    let shown = '';
    child.stdout.on('data', (c: Buffer) => (shown += c.toString()));
    child.stderr.on('data', (c: Buffer) => (shown += c.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
    await expect.poll(() => shown, { timeout: 30_000 }).toContain('Password');
    child.stdin.write(typed);
    const code = await exited;
    child.stdin.end();
    return { code, shown };
  }

  it('does not echo a password typed at a terminal', async () => {
    // A typo taken back with Backspace, then Enter.
    const { code, shown } = await createAtTerminal('typed@acme.test', 'typed secret passphraseX\u007f\r');
    expect(code).toBe(0);
    expect(shown).toContain('Created user');
    expect(shown).not.toContain('secret');
    expect(await checkPassword(ctx.services.orm.em.fork(), 'typed@acme.test', 'typed secret passphrase')).not.toBeNull();
  }, 60_000);

  it('gives up on Ctrl-C at the password prompt, in one line, creating nothing', async () => {
    const { code, shown } = await createAtTerminal('cancelled@acme.test', 'half typed\u0003');
    expect(code).toBe(1);
    expect(shown).toContain('mailroom: cancelled: no user created');
    expect(shown).not.toMatch(/\n\s+at /);
    expect(await checkPassword(ctx.services.orm.em.fork(), 'cancelled@acme.test', 'half typed')).toBeNull();
  }, 60_000);

  it('refuses bad input with one line naming the problem, and creates nothing', async () => {
    const before = await userCount();
    const cases: Array<[string[], string, RegExp]> = [
      [['user', 'create', '--org', org.organizationId, '--email', 'jane@acme.test'], 'another long one', /already exists/],
      [['user', 'create', '--org', org.organizationId, '--email', 'kim@acme.test'], 'short', /password: must be 10 to 1024 characters/],
      [['user', 'create', '--org', org.organizationId, '--email', 'not-an-address'], 'a long passphrase', /email: must be an email address/],
      [['user', 'create', '--org', 'org_01aaaaaaaaaaaaaaaaaaaaaaaa', '--email', 'kim@acme.test'], 'a long passphrase', /No organization/],
    ];
    const results = await Promise.all(cases.map(([args, input]) => cliWithStdin(args, input)));
    for (const [index, [args, , message]] of cases.entries()) {
      const result = results[index]!;
      expect(result.code, args.join(' ')).not.toBe(0);
      expect(result.stderr.split('\n')[0]).toMatch(message);
      expect(result.stderr).not.toMatch(/\n\s+at /);
    }
    expect(await userCount()).toBe(before);
    const unknown = await runCli(['user', 'list', '--org', 'org_01aaaaaaaaaaaaaaaaaaaaaaaa'], ctx.env.env);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/No organization/);
  });
});

describe('the timeline of an email on the dashboard', () => {
  it('shows a delivery the transport reported as it wrote (no event row), after the send, and not twice', async () => {
    const { organizationId } = await createOrg(ctx.services, { name: 'Timeline' });
    const [id] = await insertEmails(ctx.services.orm.em.fork(), [{ organizationId, from: 'a@acme.test', to: 'r@example.com', subject: 's', contentKind: 'html' as const, content: '<p>x</p>' }]);
    await ctx.services.orm.em.fork().execute(`update emails set status = 'sent', sent_at = now(), delivery_status = 'delivered' where id = ?`, [id]);
    const entries = async () => {
      const em = ctx.services.orm.em.fork();
      return (await emailTimeline(em, await getEmail(em, organizationId, id!))).map((t) => [t.type, t.detail]);
    };
    expect(await entries()).toEqual([
      ['queued', null],
      ['sent', null],
      ['delivered', 'reported by the transport when it took the message'],
    ]);
    // A provider's delivery event is the one shown then.
    await ctx.services.orm.em.fork().execute(`insert into email_events (email_id, organization_id, type, occurred_at, details) values (?, ?, 'delivered', now(), '{"diagnostic":"250 ok"}')`, [id, organizationId]);
    expect(await entries()).toEqual([
      ['queued', null],
      ['sent', null],
      ['delivered', '250 ok'],
    ]);
  });
});

describe('the emails list filters of the dashboard', () => {
  it('filters by last_event exactly as last_event is derived, and by recipient case-insensitively, display name aside', async () => {
    const { organizationId } = await createOrg(ctx.services, { name: 'Filters' });
    const base = { organizationId, from: 'a@acme.test', subject: 's', contentKind: 'html' as const, content: '<p>x</p>' };
    const ids = await insertEmails(
      ctx.services.orm.em.fork(),
      Array.from({ length: 9 }, (_, i) => ({ ...base, to: i === 0 ? 'Mixed.Case@Example.com' : i === 1 ? 'Mary Major <Mary@Example.com>' : `r${i}@example.com` })),
    );
    // Every combination of columns that decides last_event, one per email.
    const set = [
      [ids[1], `status = 'sent'`],
      [ids[2], `status = 'failed', failure_reason = 'x'`],
      [ids[3], `status = 'sent', delivery_status = 'delivered'`],
      [ids[4], `status = 'sent', delivery_status = 'bounced'`],
      [ids[5], `status = 'sent', delivery_status = 'complained'`],
      [ids[6], `status = 'sent', delivery_status = 'delivered', first_opened_at = now()`],
      [ids[7], `status = 'sent', delivery_status = 'delivered', first_opened_at = now(), first_clicked_at = now()`],
      [ids[8], `status = 'sent', first_clicked_at = now()`],
    ];
    for (const [id, assignment] of set) await ctx.services.orm.em.fork().execute(`update emails set ${assignment} where id = ?`, [id]);
    const all = await listEmails(ctx.services.orm.em.fork(), organizationId, { limit: 100 });
    expect(all.items).toHaveLength(9);
    // The list reads no body: html, text and content stay in the table (a page of 100 would carry them all).
    for (const column of ['html', 'text', 'content'] as const) expect(all.items.map((e) => (e as Record<string, unknown>)[column]), column).toEqual(all.items.map(() => undefined));
    for (const event of LAST_EVENTS) {
      const { items } = await listEmails(ctx.services.orm.em.fork(), organizationId, { limit: 100, lastEvent: event });
      const expected = all.items.filter((e) => lastEvent(e) === event).map((e) => e.id).sort();
      expect(items.map((e) => e.id).sort(), event).toEqual(expected);
      expect(expected.length, event).toBeGreaterThan(0);
    }
    const found = await listEmails(ctx.services.orm.em.fork(), organizationId, { limit: 100, to: ' mixed.case@example.COM ' });
    expect(found.items.map((e) => e.id)).toEqual([ids[0]]);
    // A recipient with a display name is found by the bare address, and by the whole one.
    for (const to of ['mary@example.com', 'Mary Major <mary@EXAMPLE.com>', '<mary@example.com>']) {
      const named = await listEmails(ctx.services.orm.em.fork(), organizationId, { limit: 100, to });
      expect(named.items.map((e) => e.id), to).toEqual([ids[1]]);
    }
    // By the index on the bare address (its expression and the filter's are the same).
    const plan = await ctx.services.orm.em.fork().transactional(async (tx) => {
      await tx.execute('set local enable_seqscan = off');
      return tx.execute<{ 'QUERY PLAN': string }[]>(
        `explain select id from emails where organization_id = ? and source = 'api' and email_bare_address(to_address) = email_bare_address(?) order by id desc limit 21`,
        [organizationId, 'mary@example.com'],
      );
    });
    expect(plan.map((row) => row['QUERY PLAN']).join('\n')).toContain('emails_api_recipient_address_idx');
  });
});

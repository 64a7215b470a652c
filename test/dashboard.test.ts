import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertEmails } from '../src/shared/emails/service.js';
import { createUser } from '../src/shared/users/service.js';
import { deliverEndpoint, WebhookClient } from '../src/shared/webhooks/dispatcher.js';
import { createWebhook } from '../src/shared/webhooks/service.js';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startWebhookReceiver } from './helpers/webhook-receiver.js';

// Debian's chromium (`apt-get install chromium`; .ci/run installs it when it is missing).
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const AXE = createRequire(import.meta.url).resolve('axe-core/axe.min.js');
// The screenshots of docs/dashboard.md are rewritten only when asked (DASHBOARD_SCREENSHOTS=docs);
// otherwise they go to a directory of their own, so a test run leaves the work tree clean.
const SHOTS =
  process.env.DASHBOARD_SCREENSHOTS === 'docs'
    ? fileURLToPath(new URL('../docs/dashboard/', import.meta.url))
    : `${mkdtempSync(join(tmpdir(), 'mailroom-dashboard-shots-'))}/`;
const PASSWORD = 'correct horse battery staple';

let ctx: TestContext;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let base: string;
let orgA: { organizationId: string; token: string };
let orgB: { organizationId: string; token: string };
let scriptedEmailId: string;
const axeFindings: string[] = [];

const rows = async (sql: string, params: unknown[] = []) => ctx.services.orm.em.fork().execute(sql, params, 'all') as Promise<Record<string, unknown>[]>;

/** axe-core at both widths of docs/dashboard.md "Tests"; the page is screenshotted at 1280 px for the docs. */
async function check(name: string, shot = true): Promise<void> {
  for (const width of [390, 1280]) {
    await page.setViewportSize({ width, height: 900 });
    await page.addScriptTag({ path: AXE });
    // Evaluated in the page (a string: the test's TypeScript has no DOM types).
    const violations = (await page.evaluate(
      `axe.run(document, { resultTypes: ['violations'] }).then((r) => r.violations.map((v) => ({ id: v.id, impact: v.impact, nodes: v.nodes.length })))`,
    )) as Array<{ id: string; impact: string; nodes: number }>;
    for (const v of violations) if (v.impact === 'serious' || v.impact === 'critical') axeFindings.push(`${name} @${width}px: ${v.id} (${v.impact}, ${v.nodes} nodes)`);
    // Nothing wider than the screen: the page is usable at 390 px without sideways scrolling.
    const overflow = (await page.evaluate('document.documentElement.scrollWidth - document.documentElement.clientWidth')) as number;
    if (overflow > 1) axeFindings.push(`${name} @${width}px: the page is ${overflow}px wider than the screen`);
  }
  if (shot) await page.screenshot({ path: `${SHOTS}${name}.png`, fullPage: false });
}

async function signIn(p: Page, email: string, password: string): Promise<void> {
  await p.goto(`${base}/app/login`);
  await p.fill('#email', email);
  await p.fill('#password', password);
  await Promise.all([p.waitForLoadState('load'), p.click('button[type=submit]')]);
}

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM}: apt-get install -y chromium`);
  ctx = await createTestContext();
  orgA = await createOrg(ctx.services, { name: 'Acme' });
  orgB = await createOrg(ctx.services, { name: 'Umbrella' });
  await createUser(ctx.services.orm.em.fork(), { organizationId: orgA.organizationId, email: 'jane@acme.test', password: PASSWORD });
  await createUser(ctx.services.orm.em.fork(), { organizationId: orgB.organizationId, email: 'bob@umbrella.test', password: PASSWORD });
  const email = (organizationId: string, to: string, subject: string, content: string) => ({
    organizationId,
    from: 'news@acme.test',
    to,
    subject,
    contentKind: 'html' as const,
    content,
  });
  [scriptedEmailId] = await insertEmails(ctx.services.orm.em.fork(), [
    email(
      orgA.organizationId,
      'reader@example.com',
      'Welcome aboard',
      '<p id="hello">Hello reader</p><script>document.body.setAttribute("data-ran", "yes"); parent.document.title = "pwned";</script><img src="x" onerror="document.body.setAttribute(\'data-ran\', \'img\')">',
    ),
  ]);
  await insertEmails(ctx.services.orm.em.fork(), [
    email(orgA.organizationId, 'second@example.com', 'Your invoice', '<p>Invoice</p>'),
    email(orgB.organizationId, 'secret@umbrella.test', 'Umbrella internal memo', '<p>Memo</p>'),
  ]);
  await ctx.app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(ctx.app.server.address() as { port: number }).port}`;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
  // bypassCSP only so that the test can inject axe-core; the pages' own policy is checked below.
  // A browser in Tokyo: the schedule form preselects the browser's own time zone.
  context = await browser.newContext({ bypassCSP: true, viewport: { width: 1280, height: 900 }, timezoneId: 'Asia/Tokyo' });
  page = await context.newPage();
});

afterAll(async () => {
  await browser?.close();
  await ctx?.close();
  if (process.env.DASHBOARD_SCREENSHOTS !== 'docs') rmSync(SHOTS, { recursive: true, force: true });
});

describe('dashboard in Chromium', () => {
  it('refuses a wrong password, and throttles an address after 5 failures a minute', async () => {
    await page.goto(`${base}/app/login`);
    await check('sign-in');
    await page.fill('#email', 'jane@acme.test');
    await page.fill('#password', 'not the password');
    const [answer] = await Promise.all([page.waitForResponse((r) => r.url().endsWith('/app/login') && r.request().method() === 'POST'), page.click('button[type=submit]')]);
    expect(answer.status()).toBe(401);
    await expect(page.locator('[role=alert]').textContent()).resolves.toContain('Wrong email or password');
    expect((await context.cookies()).some((c) => c.name === 'mailroom_session')).toBe(false);

    // Another address: five failures, then even the right password gets 429 for a minute.
    await createUser(ctx.services.orm.em.fork(), { organizationId: orgA.organizationId, email: 'throttled@acme.test', password: PASSWORD });
    const attempt = (password: string) =>
      fetch(`${base}/app/login`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', origin: base }, body: new URLSearchParams({ email: 'throttled@acme.test', password }), redirect: 'manual' });
    for (let i = 0; i < 5; i++) expect((await attempt('wrong')).status).toBe(401);
    const refused = await attempt(PASSWORD);
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(await refused.text()).toContain('Too many failed sign-ins');
  });

  it('lets no more than 5 of a burst of concurrent wrong passwords be checked, and does not count sign-ins that succeed', async () => {
    await createUser(ctx.services.orm.em.fork(), { organizationId: orgA.organizationId, email: 'burst@acme.test', password: PASSWORD });
    await createUser(ctx.services.orm.em.fork(), { organizationId: orgA.organizationId, email: 'regular@acme.test', password: PASSWORD });
    const attempt = (email: string, password: string) =>
      fetch(`${base}/app/login`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', origin: base }, body: new URLSearchParams({ email, password }), redirect: 'manual' });
    const burst = await Promise.all(Array.from({ length: 12 }, () => attempt('burst@acme.test', 'wrong')));
    const statuses = burst.map((r) => r.status).sort();
    expect(statuses).toEqual([...Array(5).fill(401), ...Array(7).fill(429)]);
    for (let i = 0; i < 7; i++) expect((await attempt('regular@acme.test', PASSWORD)).status).toBe(303);
  });

  it('keeps a busy session: every page renews the cookie, sign-out clears it', async () => {
    const login = await fetch(`${base}/app/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', origin: base },
      body: new URLSearchParams({ email: 'jane@acme.test', password: PASSWORD }),
      redirect: 'manual',
    });
    expect(login.status).toBe(303);
    const id = /mailroom_session=([^;]+)/.exec(login.headers.get('set-cookie') ?? '')![1]!;
    const cookie = `mailroom_session=${id}`;
    const shown = await fetch(`${base}/app/emails`, { headers: { cookie }, redirect: 'manual' });
    expect(shown.status).toBe(200);
    expect(shown.headers.getSetCookie()).toEqual([expect.stringMatching(new RegExp(`^mailroom_session=${id}; Path=/app; HttpOnly; SameSite=Lax; Max-Age=43200`))]);
    const csrf = /name="_csrf" value="([^"]+)"/.exec(await shown.text())![1]!;
    const out = await fetch(`${base}/app/logout`, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded', origin: base },
      body: new URLSearchParams({ _csrf: csrf }),
      redirect: 'manual',
    });
    expect(out.status).toBe(303);
    expect(out.headers.getSetCookie()).toEqual([expect.stringMatching(/^mailroom_session=; .*Max-Age=0/)]);
  });

  it('refuses a NUL or an unpaired surrogate in a query or a form as the API does (422 naming the field), before anything is read or counted', async () => {
    const refusedLogin = await fetch(`${base}/app/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', origin: base },
      body: new URLSearchParams({ email: 'x\u0000@acme.test', password: 'p'.repeat(12) }),
      redirect: 'manual',
    });
    expect(refusedLogin.status).toBe(422);
    expect(await refusedLogin.text()).toContain('email: must not contain a NUL character');
    const login = await fetch(`${base}/app/login`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', origin: base }, body: new URLSearchParams({ email: 'jane@acme.test', password: PASSWORD }), redirect: 'manual' });
    const cookie = `mailroom_session=${/mailroom_session=([^;]+)/.exec(login.headers.get('set-cookie') ?? '')![1]!}`;
    const shown = await fetch(`${base}/app/verification`, { headers: { cookie } });
    const csrf = /name="_csrf" value="([^"]+)"/.exec(await shown.text())![1]!;
    for (const url of ['/app/emails?to=a%00b@example.com', '/app/audience?q=%00', '/app/audience?tag=%00', '/app/campaigns?after=%00']) {
      const res = await fetch(`${base}${url}`, { headers: { cookie } });
      expect({ url, status: res.status }).toEqual({ url, status: 422 });
      expect(await res.text()).toContain('must not contain a NUL character');
    }
    const [before] = await rows('select coalesce(sum(used), 0)::int as n from verification_quotas where organization_id = ?', [orgA.organizationId]);
    for (const [url, fields] of [
      ['/app/verification', { email: 'a\u0000b@example.com' }],
      ['/app/tokens', { name: 'a\u0000b', preset: 'app' }],
      ['/app/campaigns', { name: 'ok', content: 'a\u0000b' }],
    ] as const) {
      const res = await fetch(`${base}${url}`, { method: 'POST', headers: { cookie, 'content-type': 'application/x-www-form-urlencoded', origin: base }, body: new URLSearchParams({ _csrf: csrf, ...fields }), redirect: 'manual' });
      expect({ url, status: res.status }).toEqual({ url, status: 422 });
    }
    expect(await rows('select coalesce(sum(used), 0)::int as n from verification_quotas where organization_id = ?', [orgA.organizationId])).toEqual([before]);
  });

  it('signs in and shows this organization emails and not another one', async () => {
    await signIn(page, 'jane@acme.test', PASSWORD);
    expect(new URL(page.url()).pathname).toBe('/app/emails');
    const cookie = (await context.cookies()).find((c) => c.name === 'mailroom_session')!;
    expect(cookie.httpOnly).toBe(true);
    expect(cookie.sameSite).toBe('Lax');
    expect(cookie.path).toBe('/app');
    const text = await page.locator('main').textContent();
    expect(text).toContain('Welcome aboard');
    expect(text).toContain('Your invoice');
    expect(text).not.toContain('Umbrella internal memo');
    await check('emails');

    // Recipient search and the last-event filter.
    await page.fill('#to', 'second@example.com');
    await Promise.all([page.waitForURL(/to=second/), page.click('form[role=search] button')]);
    expect(await page.locator('tbody tr').count()).toBe(1);
    await page.goto(`${base}/app/emails?event=delivered`);
    expect(await page.locator('tbody').textContent()).toContain('Nothing here yet');

    // Another organization's email by its id is a 404, not its content.
    const [otherId] = (await rows('select id from emails where organization_id = ?', [orgB.organizationId])).map((r) => r.id);
    const response = await page.goto(`${base}/app/emails/${otherId}`);
    expect(response!.status()).toBe(404);
    expect(await page.locator('main').textContent()).not.toContain('Umbrella internal memo');
  });

  it('opens an email: its HTML in a sandboxed frame whose scripts do not run, and its timeline', async () => {
    const messages: string[] = [];
    page.on('console', (m) => messages.push(m.text()));
    await page.goto(`${base}/app/emails/${scriptedEmailId}`);
    const frameElement = page.locator('iframe.preview');
    expect(await frameElement.getAttribute('sandbox')).toBe('');
    const frame = await (await frameElement.elementHandle())!.contentFrame();
    await frame!.waitForSelector('#hello');
    expect(await frame!.locator('#hello').textContent()).toBe('Hello reader');
    expect(await frame!.locator('body').getAttribute('data-ran')).toBeNull();
    expect(await page.title()).not.toBe('pwned');
    expect(await page.locator('ol.timeline').textContent()).toContain('queued');
    await check('email');
  });

  it('fits a long unbroken subject, an error message and an unknown page on the screen, as dashboard pages', async () => {
    const [org] = await rows('select organization_id from users where email = ?', ['jane@acme.test']);
    const [longId] = await insertEmails(ctx.services.orm.em.fork(), [
      { organizationId: org!.organization_id as string, from: 'news@acme.test', to: 'long@example.com', subject: `Grüße ${'x'.repeat(120)}`, contentKind: 'html', content: '<p>x</p>' },
    ]);
    await page.goto(`${base}/app/emails/${longId}`);
    await check('email-long-subject', false);
    const refused = await page.goto(`${base}/app/emails?event=${'bogus'.repeat(20)}`);
    expect(refused!.status()).toBe(422);
    await check('error-page', false);
    const missing = await page.goto(`${base}/app/no-such-page`);
    expect(missing!.status()).toBe(404);
    expect(missing!.headers()['content-type']).toMatch(/^text\/html/);
    expect(await page.locator('[role=alert]').textContent()).toContain('no such page');
    await check('not-found', false);
  });

  it('adds a domain and shows its DKIM record with a copy button; adds a sender', async () => {
    await page.goto(`${base}/app/domains`);
    await page.fill('#domain', 'acme.test');
    await Promise.all([page.waitForURL(/\/app\/domains\/dom_/), page.click('form.inline button')]);
    const dkim = page.locator('tr', { hasText: 'DKIM' });
    expect(await dkim.textContent()).toMatch(/_domainkey\.acme\.test/);
    const [stored] = await rows(`select dns_records from domains where organization_id = ?`, [orgA.organizationId]);
    const record = (stored!.dns_records as Array<{ purpose: string; value: string }>).find((r) => r.purpose === 'dkim')!;
    expect(await dkim.locator('button[data-copy]').nth(1).getAttribute('data-copy')).toBe(record.value);
    // What to do next, in the dashboard's own terms (its button, not an API call).
    expect(await page.locator('dl.facts').textContent()).toContain('then choose "Verify now"');
    await check('domain');
    // This domain's form takes this domain's addresses only.
    const domainPage = page.url();
    await page.fill('#sender-name', 'Elsewhere');
    await page.fill('#sender-email', 'x@mail.acme.test');
    const [refused] = await Promise.all([page.waitForResponse((r) => r.request().method() === 'POST'), page.click('form[action$="/senders"] button')]);
    expect(refused.status()).toBe(422);
    expect(await page.locator('[role=alert]').textContent()).toContain('must be an address at acme.test');
    expect(await rows(`select 1 from senders where email = 'x@mail.acme.test'`)).toEqual([]);
    // In place: the domain's page again, the form as it was filled in.
    expect(await page.locator('h2', { hasText: 'DNS records to publish' }).count()).toBe(1);
    expect([await page.inputValue('#sender-name'), await page.inputValue('#sender-email')]).toEqual(['Elsewhere', 'x@mail.acme.test']);
    await page.goto(domainPage);
    await page.fill('#sender-name', 'Acme Newsletter and Product Updates Team');
    await page.fill('#sender-email', 'news@acme.test');
    await Promise.all([page.waitForURL(/notice=sender_added/), page.click('form[action$="/senders"] button')]);
    expect(await page.locator('main').textContent()).toContain('news@acme.test');
    await page.goto(`${base}/app/domains`);
    await check('domains');
    // A domain the API refuses: the list again, with the reason and what was typed.
    await page.fill('#domain', 'not a domain!');
    const [bad] = await Promise.all([page.waitForResponse((r) => r.request().method() === 'POST'), page.click('form.inline button')]);
    expect(bad.status()).toBe(422);
    expect(await page.locator('[role=alert]').textContent()).toContain('domain');
    expect(await page.inputValue('#domain')).toBe('not a domain!');
    expect(await page.locator('table').count()).toBe(1);
  });

  it('writes a campaign with a live preview, and schedules it in a time zone', async () => {
    await page.goto(`${base}/app/campaigns/new`);
    await page.fill('#name', 'November news');
    await page.fill('#subject', 'What is new');
    await page.selectOption('#senderId', { label: 'Acme Newsletter and Product Updates Team <news@acme.test>' });
    await page.fill('#content', '# Big news\n\nWe shipped **the dashboard**.\n\n[Unsubscribe]({{unsubscribe_url}})');
    const preview = page.frameLocator('#live-preview iframe');
    await expect.poll(async () => preview.locator('h1').textContent().catch(() => null), { timeout: 10_000 }).toBe('Big news');
    await check('campaign-new');
    await Promise.all([page.waitForURL(/\/app\/campaigns\/cmp_/), page.click('#campaign-form button[type=submit]')]);
    const id = new URL(page.url()).pathname.split('/').pop()!;
    await page.fill('#test-to', 'tester@example.com');
    await Promise.all([page.waitForURL(/notice=test_sent/), page.click('form[action$="/test"] button')]);
    const tests = await rows(`select to_address, subject from emails where campaign_id = ? and source = 'test'`, [id]);
    expect(tests).toEqual([{ to_address: 'tester@example.com', subject: 'What is new' }]);
    await page.fill('#scheduledAt', '2030-06-01T09:30');
    expect(await page.locator('#timezone').inputValue()).toBe('Asia/Tokyo');
    expect(await page.locator('#timezone option[value="UTC"]').count()).toBe(1);
    await page.selectOption('#timezone', 'America/New_York');
    await Promise.all([page.waitForURL(/notice=scheduled/), page.click('form[action$="/schedule"] button')]);
    expect(await page.locator('main').textContent()).toContain('SCHEDULED');
    const [row] = await rows('select status, scheduled_at, timezone from campaigns where id = ?', [id]);
    expect(row!.status).toBe('SCHEDULED');
    expect(new Date(row!.scheduled_at as string).toISOString()).toBe('2030-06-01T13:30:00.000Z');
    expect(row!.timezone).toBe('America/New_York');
    await check('campaign');
    await page.goto(`${base}/app/campaigns`);
    expect(await page.locator('tbody').textContent()).toContain('November news');
    await check('campaigns');
  });

  it('keeps a campaign form as it was filled in when the API refuses it, creating or saving nothing', async () => {
    const content = '# Draft\n\nA long text the user must not lose.\n\n[Unsubscribe]({{unsubscribe_url}})';
    const refuse = async (action: string) => {
      // A name over the API's 100 characters (the browser's own maxlength taken off).
      await page.evaluate("document.querySelector('#name').removeAttribute('maxlength')");
      await page.fill('#name', 'n'.repeat(101));
      await page.fill('#subject', 'Kept subject');
      await page.fill('#content', content);
      const [answer] = await Promise.all([page.waitForResponse((r) => r.request().method() === 'POST' && r.url().endsWith(action)), page.click('#campaign-form button[type=submit]')]);
      expect(answer.status()).toBe(422);
      expect(await page.locator('[role=alert]').textContent()).toContain('name');
      expect(await page.locator('#content').inputValue()).toBe(content);
      expect(await page.locator('#subject').inputValue()).toBe('Kept subject');
      expect(await page.locator('#name').inputValue()).toBe('n'.repeat(101));
    };
    const before = await rows('select count(*)::int as n from campaigns');
    await page.goto(`${base}/app/campaigns/new`);
    await refuse('/app/campaigns');
    expect(await rows('select count(*)::int as n from campaigns')).toEqual(before);
    // Mended, the same form creates the draft.
    await page.fill('#name', 'Kept draft');
    await Promise.all([page.waitForURL(/\/app\/campaigns\/cmp_.*notice=created/), page.click('#campaign-form button[type=submit]')]);
    const id = new URL(page.url()).pathname.split('/').pop()!;
    await refuse(`/app/campaigns/${id}`);
    expect(await rows('select name, subject from campaigns where id = ?', [id])).toEqual([{ name: 'Kept draft', subject: 'Kept subject' }]);
  });

  it('saves Markdown with the API\'s line ends, and leaves content it did not change as it was', async () => {
    const created = await fetch(`${base}/api/v2/campaigns`, {
      method: 'POST',
      headers: { authorization: `Bearer ${orgA.token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'Line ends', subject: 'Old', content: 'Hi {{name}}\n\n[Unsubscribe]({{unsubscribe_url}})' }),
    }).then((r) => r.json() as Promise<{ id: string }>);
    await page.goto(`${base}/app/campaigns/${created.id}`);
    await page.fill('#subject', 'New');
    await Promise.all([page.waitForURL(/notice=saved/), page.click('#campaign-form button[type=submit]')]);
    expect(await rows('select subject, content from campaigns where id = ?', [created.id])).toEqual([{ subject: 'New', content: 'Hi {{name}}\n\n[Unsubscribe]({{unsubscribe_url}})' }]);
    await page.fill('#content', 'Line one\nLine two\n\n[Unsubscribe]({{unsubscribe_url}})');
    await Promise.all([page.waitForURL(/notice=saved/), page.click('#campaign-form button[type=submit]')]);
    const [row] = await rows('select content from campaigns where id = ?', [created.id]);
    expect(row!.content).toBe('Line one\nLine two\n\n[Unsubscribe]({{unsubscribe_url}})');
  });

  it('imports a CSV with a progress bar, and refuses a file that is not CSV', async () => {
    await page.goto(`${base}/app/audience/import`);
    await check('import');
    await page.setInputFiles('#file', { name: 'photo.csv', mimeType: 'text/csv', buffer: Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13]) });
    const [refused] = await Promise.all([page.waitForResponse((r) => r.request().method() === 'POST'), page.click('main button[type=submit]')]);
    expect(refused.status()).toBe(422);
    expect(await page.locator('[role=alert]').textContent()).toContain('not a CSV file');
    expect((await rows('select count(*)::int as n from subscribers where organization_id = ?', [orgA.organizationId]))[0]!.n).toBe(0);

    await page.goto(`${base}/app/audience/import`);
    const csv = 'email,name,tags,plan\nada@example.com,Ada,vip;beta,pro\ngrace@example.com,Grace,beta,free\nnot-an-address,Nobody,,\nADA@example.com,,late,\n';
    await page.setInputFiles('#file', { name: 'people.csv', mimeType: 'text/csv', buffer: Buffer.from(csv) });
    await Promise.all([page.waitForURL(/\/app\/audience\/import\/imp_/), page.click('main button[type=submit]')]);
    await expect.poll(async () => page.locator('#import-progress label').textContent(), { timeout: 15_000 }).toBe('Import finished');
    expect(await page.locator('#import-progress progress').getAttribute('value')).toBe('4');
    // Every row counted once, the second Ada merged into the first (as the CLI counts it).
    expect(await page.locator('#import-progress [role=status]').textContent()).toBe('4 of 4 rows: 2 created, 0 updated, 1 skipped, 1 merged into an earlier row of their address.');
    expect(await page.locator('#import-progress').textContent()).toContain('line 4: invalid email address');
    await check('import-progress');
    await page.goto(`${base}/app/audience?q=ada`);
    await page.click('text=ada@example.com');
    expect(await page.locator('ul.tags').textContent()).toContain('vip');
    await page.fill('#tag', 'speaker');
    await Promise.all([page.waitForURL(/notice=tag_added/), page.click('form[action$="/tags"] button')]);
    expect(await page.locator('ul.tags').textContent()).toContain('speaker');
    await check('subscriber');
    // A tag of repeated spaces filters by itself (an option without a value sends its text collapsed).
    await page.fill('#tag', 'big   spender');
    await Promise.all([page.waitForURL(/notice=tag_added/), page.click('form[action$="/tags"] button')]);
    await page.goto(`${base}/app/audience`);
    await page.selectOption('#tag', 'big   spender');
    await Promise.all([page.waitForURL(/tag=big/), page.click('form[role=search] button')]);
    expect(await page.locator('main table').textContent()).toContain('ada@example.com');
    await page.goto(`${base}/app/audience`);
    await check('audience');
  });

  it('creates a token shown once, which the API accepts, and revokes it: the API then refuses it', async () => {
    await page.goto(`${base}/app/tokens`);
    await page.fill('#token-name', 'ci deploy');
    await page.selectOption('#preset', 'app');
    await Promise.all([page.waitForURL(/notice=token_created/), page.click('form[action="/app/tokens"] button')]);
    const secret = (await page.locator('#new-token').textContent())!.trim();
    expect(secret).toMatch(/^svc_[0-9a-f]{64}$/);
    await check('token-created', false);
    // The form redirected (post, redirect, get): a reload neither shows the secret again nor
    // creates a second token.
    const tokensNamed = async () => (await rows(`select id from api_tokens where organization_id = ? and name = 'ci deploy'`, [orgA.organizationId])).length;
    expect(await tokensNamed()).toBe(1);
    await page.reload();
    expect(await page.locator('#new-token').count()).toBe(0);
    expect(await tokensNamed()).toBe(1);
    const api = (token: string) => fetch(`${base}/api/v2/subscribers?limit=1`, { headers: { authorization: `Bearer ${token}` } });
    expect((await api(secret)).status).toBe(200);
    await page.goto(`${base}/app/tokens`);
    expect(await page.locator('main').textContent()).not.toContain(secret);
    await check('tokens');
    await Promise.all([page.waitForURL(/notice=revoked/), page.click('button[aria-label="Revoke the token ci deploy"]')]);
    const refused = await api(secret);
    expect(refused.status).toBe(401);
    expect(((await refused.json()) as { name: string }).name).toBe('missing_api_key');
    // The organization's first token still works.
    expect((await api(orgA.token)).status).toBe(200);
  });

  it('adds a webhook endpoint with its secret shown once, sends it a test event, lists and retries the delivery; refuses a bad or private URL', async () => {
    const receiver = await startWebhookReceiver();
    const client = new WebhookClient({ dns: ctx.services.dns.fresh, allowPrivateUrls: true });
    const endpoints = async () => rows('select id, url, events from webhook_endpoints where organization_id = ?', [orgA.organizationId]);
    try {
      // A URL that is not http(s): the API's message on the page, the form as it was, nothing created.
      await page.goto(`${base}/app/webhooks`);
      await page.fill('#webhook-url', 'ftp://hooks.example.com/in');
      await page.check('#event-email-delivered');
      const [refused] = await Promise.all([page.waitForResponse((r) => r.request().method() === 'POST'), page.click('form[action="/app/webhooks"] button[type=submit]')]);
      expect(refused.status()).toBe(422);
      await page.waitForLoadState('load');
      expect(await page.locator('[role=alert]').textContent()).toContain('url: must be an http or https URL');
      expect(await page.inputValue('#webhook-url')).toBe('ftp://hooks.example.com/in');
      expect(await page.isChecked('#event-email-delivered')).toBe(true);
      expect(await endpoints()).toEqual([]);

      // A loopback address while private addresses are refused (as in production): the service's reason.
      ctx.services.config.webhookAllowPrivateUrls = false;
      try {
        await page.fill('#webhook-url', `${receiver.url}/ok`);
        const [private_] = await Promise.all([page.waitForResponse((r) => r.request().method() === 'POST'), page.click('form[action="/app/webhooks"] button[type=submit]')]);
        expect(private_.status()).toBe(422);
        await page.waitForLoadState('load');
        expect(await page.locator('[role=alert]').textContent()).toContain('The URL is refused');
        expect(await endpoints()).toEqual([]);
      } finally {
        ctx.services.config.webhookAllowPrivateUrls = true;
      }

      // An endpoint on a local receiver (private addresses are allowed outside production).
      await page.fill('#webhook-url', `${receiver.url}/ok`);
      await page.check('#event-email-bounced');
      await page.fill('#webhook-description', 'CRM sync');
      await Promise.all([page.waitForURL(/notice=webhook_created/), page.click('form[action="/app/webhooks"] button[type=submit]')]);
      const secret = (await page.locator('#new-webhook-secret').textContent())!.trim();
      expect(secret).toMatch(/^whsec_/);
      // Post, redirect, get: a reload adds no second endpoint and does not show the secret again.
      await page.reload();
      expect(await page.locator('#new-webhook-secret').count()).toBe(0);
      expect(await endpoints()).toHaveLength(1);
      const [stored] = await endpoints();
      expect(stored).toMatchObject({ url: `${receiver.url}/ok`, events: ['email.delivered', 'email.bounced'] });
      const id = stored!.id as string;
      await check('webhook-created', false);
      await page.goto(`${base}/app/webhooks`);
      expect(await page.locator('main').textContent()).not.toContain(secret);
      expect(await page.locator('tbody').textContent()).toContain('email.delivered, email.bounced');
      await check('webhooks');

      // A test event: listed at once as pending; the workers' run for this endpoint (here, in
      // the test) posts it to the receiver signed with the secret shown above.
      await Promise.all([page.waitForURL(/notice=webhook_test/), page.click(`button[aria-label="Send test event to ${receiver.url}/ok"]`)]);
      expect(new URL(page.url()).pathname).toBe(`/app/webhooks/${id}`);
      expect(await page.locator('tbody tr').count()).toBe(1);
      expect(await page.locator('tbody').textContent()).toMatch(/webhook\.test\s*pending/);
      await deliverEndpoint({ em: ctx.services.orm.em.fork(), box: ctx.services.box, client, clock: ctx.services.clock }, id);
      expect(receiver.at('/ok')).toHaveLength(1);
      const event = new Webhook(secret).verify(receiver.at('/ok')[0]!.body, receiver.at('/ok')[0]!.headers as Record<string, string>) as { type: string };
      expect(event.type).toBe('webhook.test');
      await page.reload();
      const delivery = page.locator('tbody tr').first();
      expect((await delivery.locator('td').allTextContents()).slice(0, 4).map((t) => t.trim())).toEqual(['webhook.test', 'succeeded', '1', '200']);
      await check('webhook');

      // Retry: the same service as POST /api/v2/webhooks/{id}/deliveries/{msgId}/retry.
      await Promise.all([page.waitForURL(/notice=webhook_retry/), delivery.locator('button', { hasText: 'Retry' }).click()]);
      expect(await page.locator('tbody tr').first().locator('td').nth(1).textContent()).toBe('pending');
      const [message] = await rows('select status, attempts from webhook_messages where endpoint_id = ?', [id]);
      expect(message).toEqual({ status: 'pending', attempts: 1 });

      // Another organization's endpoint is a 404.
      const other = await createWebhook(
        { em: ctx.services.orm.em.fork(), box: ctx.services.box, dns: ctx.services.dns.fresh, allowPrivateUrls: true },
        orgB.organizationId,
        { url: 'https://umbrella.example.com/hooks', events: ['*'] },
      );
      expect((await page.goto(`${base}/app/webhooks/${other.id}`))!.status()).toBe(404);
      await page.goto(`${base}/app/webhooks`);
      expect(await page.locator('main').textContent()).not.toContain('umbrella.example.com');

      await Promise.all([page.waitForURL(/notice=webhook_deleted/), page.click(`button[aria-label="Delete the endpoint ${receiver.url}/ok"]`)]);
      expect(await endpoints()).toEqual([]);
    } finally {
      await client.close();
      await receiver.close();
    }
  });

  it('checks one address and shows the quota as a meter; shows the settings', async () => {
    await page.goto(`${base}/app/verification`);
    await page.fill('#email', 'someone@example.com');
    await Promise.all([page.waitForLoadState('load'), page.click('form.inline button')]);
    expect(await page.locator('#verification-result').textContent()).toContain('someone@example.com');
    expect(await page.locator('meter#quota').getAttribute('value')).toBe('1');
    await check('verification');
    await page.goto(`${base}/app/settings`);
    await check('settings');
    await page.uncheck('#trackClicks');
    await Promise.all([page.waitForURL(/notice=saved/), page.click('form[action="/app/settings"] button')]);
    const [org] = await rows('select track_clicks, track_opens from organizations where id = ?', [orgA.organizationId]);
    expect(org).toEqual({ track_clicks: false, track_opens: true });
  });

  it('refuses a form posted from another site, and changes nothing', async () => {
    const evil: Server = createServer((_req, res) => {
      res.setHeader('content-type', 'text/html');
      res.end(`<form id="f" method="post" action="${base}/app/settings"><input name="doubleOptIn" value="on"></form><script>document.getElementById('f').submit()</script>`);
    });
    await new Promise<void>((resolve) => evil.listen(0, '127.0.0.1', resolve));
    try {
      const evilPage = await context.newPage();
      const answer = evilPage.waitForResponse((r) => r.url() === `${base}/app/settings` && r.request().method() === 'POST');
      await evilPage.goto(`http://127.0.0.1:${(evil.address() as { port: number }).port}/`);
      expect((await answer).status()).toBe(403);
      await evilPage.waitForLoadState('load');
      expect(await evilPage.locator('[role=alert]').textContent()).toContain('sent from another site');
      await evilPage.close();
    } finally {
      evil.close();
    }
    // A post without the session's token is refused too.
    const forged = await page.evaluate("fetch('/app/settings', { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: 'doubleOptIn=on' }).then((r) => r.status)");
    expect(forged).toBe(403);
    // So is one sent as multipart, which no form field is read from before the handler (only the
    // import's handler reads its token from the form; an empty multipart settings form would turn
    // every setting off).
    const multipart = await page.evaluate("const f = new FormData(); f.append('doubleOptIn', 'on'); fetch('/app/settings', { method: 'POST', body: f }).then((r) => r.status)");
    expect(multipart).toBe(403);
    const [org] = await rows('select double_opt_in, track_opens from organizations where id = ?', [orgA.organizationId]);
    expect(org).toEqual({ double_opt_in: false, track_opens: true });
  });

  it('sends an expired session to the sign-in page, and changes nothing', async () => {
    await page.goto(`${base}/app/settings`);
    // The session's 12 hours pass: its Redis key is gone.
    const keys = await ctx.services.redis.keys(`${ctx.env.config.redisPrefix}:dashboard:session:*`);
    expect(keys.length).toBeGreaterThan(0);
    await ctx.services.redis.del(...keys);
    await page.check('#doubleOptIn');
    await Promise.all([page.waitForURL(/\/app\/login/), page.click('form[action="/app/settings"] button')]);
    expect(await page.locator('[role=status]').textContent()).toContain('session has expired');
    const [org] = await rows('select double_opt_in from organizations where id = ?', [orgA.organizationId]);
    expect(org!.double_opt_in).toBe(false);
  });

  it('sends an htmx request of an expired session to the sign-in page as a whole (HX-Redirect), not into the panel it updates', async () => {
    await signIn(page, 'jane@acme.test', PASSWORD);
    // The editor asks for its first preview once loaded (`hx-trigger="load"`): the session ends
    // after that answer, or that request would be the one sent to the sign-in page.
    const firstPreview = page.waitForResponse((r) => r.url() === `${base}/app/campaigns/preview`);
    await page.goto(`${base}/app/campaigns/new`);
    expect((await firstPreview).status()).toBe(200);
    const keys = await ctx.services.redis.keys(`${ctx.env.config.redisPrefix}:dashboard:session:*`);
    await ctx.services.redis.del(...keys);
    await Promise.all([page.waitForURL(/\/app\/login\?notice=expired/), page.fill('#content', '# typed after the session ended')]);
    expect(await page.locator('#live-preview').count()).toBe(0);
  });

  it('signs out', async () => {
    await signIn(page, 'jane@acme.test', PASSWORD);
    await Promise.all([page.waitForURL(/signed_out/), page.click('.signout button')]);
    const response = await page.goto(`${base}/app/emails`);
    expect(new URL(response!.url()).pathname).toBe('/app/login');
  });

  it('has no serious or critical axe-core violation on any page at 390 and 1280 px', () => {
    expect(axeFindings).toEqual([]);
  });
});

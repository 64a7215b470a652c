import { createHmac } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/api/app.js';
import { insertEmails } from '../src/shared/emails/service.js';
import { writeHits } from '../src/shared/outcomes/recorder.js';
import { clickToken, openToken } from '../src/shared/outcomes/tokens.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startTestWorkers, type TestWorkers } from './helpers/hooks-workers.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';
import { until } from './helpers/until.js';

const SECRET = 'whsec-test-secret';
const PUBLIC_URL = 'http://mailroom.test';

let sink: SmtpSink;
let ctx: TestContext;
let token: string;
let organizationId: string;
let workers: TestWorkers | undefined;

beforeAll(async () => {
  sink = await startSmtpSink();
  ctx = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, PROVIDER_WEBHOOK_SECRET: SECRET, PUBLIC_URL });
  ({ token, organizationId } = await createOrg(ctx.services));
  workers = await startTestWorkers(ctx, [emailSendProcessor('emails', { reconcileGraceMs: 0 })]);
});
afterAll(async () => {
  await workers?.close();
  await ctx?.close();
  await sink?.close();
});

const sql = <T = Record<string, unknown>>(query: string, params: unknown[] = []) =>
  ctx.services.orm.em.fork().execute<T[]>(query, params, 'all');

async function send(to: string, html = '<p>Hello</p>') {
  const response = await ctx.app.inject({
    method: 'POST',
    url: '/api/v2/emails',
    headers: bearer(token),
    payload: { from: 'Acme <news@acme.test>', to, subject: 'Hi', html },
  });
  expect(response.statusCode).toBe(200);
  return response.json().id as string;
}

async function getEmail(id: string) {
  const response = await ctx.app.inject({ url: `/api/v2/emails/${id}`, headers: bearer(token) });
  expect(response.statusCode).toBe(200);
  return response.json();
}

async function listed(id: string) {
  const rows = (await ctx.app.inject({ url: '/api/v2/emails?limit=100', headers: bearer(token) })).json().data as { id: string; last_event: string }[];
  return rows.find((r) => r.id === id)?.last_event;
}

/** Waits until the email reads `event` on both the get and the list. */
async function expectLastEvent(id: string, event: string) {
  await until(() => getEmail(id), (e) => e.last_event === event);
  expect(await listed(id)).toBe(event);
}

const sign = (body: string, secret = SECRET) => `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`;

function webhook(event: object | string, signature?: string | null, app = ctx.app) {
  const body = typeof event === 'string' ? event : JSON.stringify(event);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (signature !== null) headers['x-mailroom-signature'] = signature ?? sign(body);
  return app.inject({ method: 'POST', url: '/webhooks/provider', headers, payload: body });
}

/** The message the SMTP server received for an email. */
async function receivedHtml(messageId: string): Promise<string> {
  const mail = await until(
    async () => sink.messages.find((m) => m.messageId === `<${messageId}>`),
    (m) => m !== undefined,
  );
  return String(mail!.html);
}

const hrefs = (html: string) => [...html.matchAll(/href="([^"]*)"/g)].map((m) => m[1]!.replace(/&amp;/g, '&'));
const localPath = (url: string) => url.slice(PUBLIC_URL.length);

async function eventCount(emailId: string, type?: string) {
  const [row] = await sql<{ n: number }>(`select count(*)::int as n from email_events where email_id = ? and (?::text is null or type = ?)`, [
    emailId,
    type ?? null,
    type ?? null,
  ]);
  return row!.n;
}

const LINKS_HTML = `<html><body>
<p><a href="https://shop.acme.test/offer?a=1&amp;b=2">Offer</a></p>
<p><a href="http://acme.test/plain">Plain</a> <a href="mailto:help@acme.test">Mail</a> <a href="tel:+123">Call</a>
<a href="#top">Top</a> <a href="${PUBLIC_URL}/u/abc.def">Unsubscribe</a> <a href="{{unsubscribe_url}}">Unsub</a>
<a href="${PUBLIC_URL}/confirm/abc.def">Confirm</a></p>
</body></html>`;

describe('lifecycle over SMTP', () => {
  it('reads queued until the email is handed over', async () => {
    // Inserted without a job: nothing hands it over, so it stays queued.
    const [id] = await insertEmails(ctx.services.orm.em.fork(), [
      { organizationId, from: 'news@acme.test', to: 'later@example.com', subject: 'Later', contentKind: 'html', content: '<p>x</p>' },
    ]);
    expect((await getEmail(id!)).last_event).toBe('queued');
    expect(await listed(id!)).toBe('queued');
  });

  it('goes queued -> sent -> delivered -> opened -> clicked by following its own pixel and links', async () => {
    const id = await send('jane@example.com', LINKS_HTML);
    const queued = await getEmail(id);
    expect(['queued', 'sent']).toContain(queued.last_event);
    await expectLastEvent(id, 'sent');
    const email = await getEmail(id);
    // The stored HTML is the body without tracking (docs/emails.md "Rendering").
    expect(email.html).not.toContain('/t/');

    const html = await receivedHtml(email.message_id);
    const links = hrefs(html);
    const tracked = links.filter((l) => l.startsWith(`${PUBLIC_URL}/t/c/`));
    expect(tracked).toHaveLength(2);
    // The service's own links are left as they are.
    expect(links).toEqual(expect.arrayContaining(['mailto:help@acme.test', 'tel:+123', '#top', `${PUBLIC_URL}/u/abc.def`, '{{unsubscribe_url}}', `${PUBLIC_URL}/confirm/abc.def`]));
    const pixel = /<img src="([^"]+)"/.exec(html)?.[1];
    expect(pixel).toMatch(new RegExp(`^${PUBLIC_URL}/t/o/.+\\.gif$`));

    expect((await webhook({ type: 'delivered', messageId: email.message_id })).statusCode).toBe(200);
    await expectLastEvent(id, 'delivered');

    const open = await ctx.app.inject({ url: localPath(pixel!), headers: { 'user-agent': 'MailClient/1.0' } });
    expect(open.statusCode).toBe(200);
    expect(open.headers['content-type']).toBe('image/gif');
    expect(open.rawPayload.subarray(0, 6).toString()).toBe('GIF89a');
    await expectLastEvent(id, 'opened');

    const click = await ctx.app.inject({ url: localPath(tracked[0]!) });
    expect(click.statusCode).toBe(302);
    expect(click.headers.location).toBe('https://shop.acme.test/offer?a=1&b=2');
    const second = await ctx.app.inject({ url: localPath(tracked[1]!) });
    expect(second.headers.location).toBe('http://acme.test/plain');
    await expectLastEvent(id, 'clicked');

    await until(() => eventCount(id, 'click'), (n) => n === 2);
    const [event] = await sql<{ user_agent: string; url: string | null; ip: string }>(
      `select user_agent, url, ip from email_events where email_id = ? and type = 'open'`,
      [id],
    );
    expect(event).toMatchObject({ user_agent: 'MailClient/1.0', url: null });
    // The provider's delivery proves the mailbox (and the open of an email to it alone).
    const [history] = await sql<{ proven_at: Date | null }>(`select proven_at from verification_history where email = 'jane@example.com'`);
    expect(history?.proven_at).toBeTruthy();
  });

  it('an open proves the mailbox of an email that went to it alone (docs/security.md), not of one with a copy', async () => {
    const proven = async (address: string) =>
      (await sql<{ proven_at: Date | null }>(`select proven_at from verification_history where email = ?`, [address]))[0]?.proven_at ?? null;
    const alone = await send('alone@example.com');
    await expectLastEvent(alone, 'sent');
    const pixel = /<img src="([^"]+)"/.exec(await receivedHtml((await getEmail(alone)).message_id))![1]!;
    expect((await ctx.app.inject({ url: localPath(pixel) })).statusCode).toBe(200);
    await expectLastEvent(alone, 'opened');
    expect(await until(() => proven('alone@example.com'), (at) => at !== null)).toBeTruthy();

    // With a bcc (to oneself, say) the same pixel is in another copy: it proves nothing of `to`.
    const copied = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/emails',
      headers: bearer(token),
      payload: { from: 'Acme <news@acme.test>', to: 'nobody-there@example.com', bcc: ['me@acme.test'], subject: 'Hi', html: '<p>Hello</p>' },
    });
    const id = copied.json().id as string;
    await expectLastEvent(id, 'sent');
    const copiedPixel = /<img src="([^"]+)"/.exec(await receivedHtml((await getEmail(id)).message_id))![1]!;
    expect((await ctx.app.inject({ url: localPath(copiedPixel) })).statusCode).toBe(200);
    await expectLastEvent(id, 'opened');
    expect(await proven('nobody-there@example.com')).toBeNull();
  });

  it('counts a click as the open when no open was seen (images blocked)', async () => {
    const id = await send('blocked-images@example.com', LINKS_HTML);
    await expectLastEvent(id, 'sent');
    const links = hrefs(await receivedHtml((await getEmail(id)).message_id)).filter((l) => l.includes('/t/c/'));
    expect((await ctx.app.inject({ url: localPath(links[0]!) })).statusCode).toBe(302);
    await expectLastEvent(id, 'clicked');
    const [row] = await sql<{ first_opened_at: Date | null }>('select first_opened_at from emails where id = ?', [id]);
    expect(row!.first_opened_at).toBeTruthy();
  });

  it('goes to bounced by a signed webhook, suppresses the address and stops a later send', async () => {
    await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(token), payload: { email: 'gone@example.com' } });
    const id = await send('Gone <Gone@Example.com>');
    await expectLastEvent(id, 'sent');
    const { message_id: messageId } = await getEmail(id);
    const response = await webhook({ type: 'bounced', messageId: `<${messageId}>`, bounceType: 'hard', diagnostic: '550 5.1.1 user unknown' });
    expect(response.statusCode).toBe(200);
    expect(response.json()).toMatchObject({ id, last_event: 'bounced', changed: true });
    await expectLastEvent(id, 'bounced');

    const [subscriber] = await sql<{ status: string }>('select status from subscribers where email = ?', ['gone@example.com']);
    expect(subscriber!.status).toBe('BOUNCED');
    expect(await sql('select address, reason from suppressions where organization_id = ?', [organizationId])).toEqual([
      { address: 'gone@example.com', reason: 'hard_bounce' },
    ]);
    const [history] = await sql<{ hard_bounced_at: Date | null; mailbox_not_found_at: Date | null }>(
      `select hard_bounced_at, mailbox_not_found_at from verification_history where email = 'gone@example.com'`,
    );
    expect(history!.hard_bounced_at).toBeTruthy();
    expect(history!.mailbox_not_found_at).toBeTruthy();

    // A replay is harmless.
    const replay = await webhook({ type: 'bounced', messageId, bounceType: 'hard', diagnostic: '550 5.1.1 user unknown' });
    expect(replay.json()).toMatchObject({ last_event: 'bounced', changed: false });
    expect(await eventCount(id, 'bounced')).toBe(1);

    // Later sends to the address are accepted but never handed to the provider.
    const before = sink.accepted;
    const later = await send('gone@example.com');
    await expectLastEvent(later, 'failed');
    const [row] = await sql<{ failure_reason: string; message_id: string | null }>('select failure_reason, message_id from emails where id = ?', [later]);
    expect(row).toEqual({ failure_reason: 'suppressed', message_id: null });
    expect(sink.accepted).toBe(before);
  });

  it('leaves suppressed cc and bcc recipients out and sends to the rest; fails only when every recipient is suppressed', async () => {
    for (const address of ['sup-cc@example.com', 'sup-bcc@example.com', 'sup-to@example.com']) {
      await sql(`insert into suppressions (organization_id, address, reason) values (?, ?, 'hard_bounce')`, [organizationId, address]);
    }
    const sendWith = async (subject: string, recipients: { to: string; cc?: string[]; bcc?: string[] }) => {
      const response = await ctx.app.inject({
        method: 'POST',
        url: '/api/v2/emails',
        headers: bearer(token),
        payload: { from: 'Acme <news@acme.test>', subject, html: '<p>Hi</p>', ...recipients },
      });
      expect(response.statusCode).toBe(200);
      return response.json().id as string;
    };
    const envelopeOf = async (subject: string) => {
      const index = await until(async () => sink.messages.findIndex((m) => m.subject === subject), (i) => i >= 0);
      return { envelope: [...sink.envelopes[index]!].sort(), cc: sink.messages[index]!.headers.get('cc') };
    };

    // Some copies suppressed (matched bare and case-insensitively): the others receive it.
    const some = await sendWith('copies partly suppressed', {
      to: 'live-to@example.com',
      cc: ['Sup <SUP-CC@example.com>', 'live-cc@example.com'],
      bcc: ['sup-bcc@example.com'],
    });
    await expectLastEvent(some, 'sent');
    const partly = await envelopeOf('copies partly suppressed');
    expect(partly.envelope).toEqual(['live-cc@example.com', 'live-to@example.com']);
    // The headers still say what the sender wrote.
    expect(JSON.stringify(partly.cc)).toContain('SUP-CC@example.com');

    // The `to` suppressed but a copy live: the copy receives it, the email reads sent.
    const toOnly = await sendWith('to suppressed', { to: 'sup-to@example.com', bcc: ['live-bcc@example.com'] });
    await expectLastEvent(toOnly, 'sent');
    expect((await envelopeOf('to suppressed')).envelope).toEqual(['live-bcc@example.com']);

    // Every recipient suppressed: never handed over, failed like a suppressed `to` alone.
    const before = sink.accepted;
    const all = await sendWith('all suppressed', { to: 'Sup-To@Example.com', cc: ['sup-cc@example.com'], bcc: ['<sup-bcc@example.com>', 'sup-to@example.com'] });
    await expectLastEvent(all, 'failed');
    const [row] = await sql<{ failure_reason: string; message_id: string | null }>('select failure_reason, message_id from emails where id = ?', [all]);
    expect(row).toEqual({ failure_reason: 'suppressed', message_id: null });
    expect(sink.accepted).toBe(before);
    expect(sink.messages.some((m) => m.subject === 'all suppressed')).toBe(false);
  });

  it('moves delivered -> complained, keeps complained over a late delivered, marks the subscriber COMPLAINED', async () => {
    await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(token), payload: { email: 'angry@example.com' } });
    const id = await send('angry@example.com');
    await expectLastEvent(id, 'sent');
    const { message_id: messageId } = await getEmail(id);
    await webhook({ type: 'delivered', messageId });
    await expectLastEvent(id, 'delivered');
    expect((await webhook({ type: 'complained', messageId })).json()).toMatchObject({ last_event: 'complained', changed: true });
    expect((await webhook({ type: 'delivered', messageId })).json()).toMatchObject({ last_event: 'complained', changed: false });
    await expectLastEvent(id, 'complained');
    const [subscriber] = await sql<{ status: string }>('select status from subscribers where email = ?', ['angry@example.com']);
    expect(subscriber!.status).toBe('COMPLAINED');
    const [history] = await sql<{ complained_at: Date | null }>(`select complained_at from verification_history where email = 'angry@example.com'`);
    expect(history!.complained_at).toBeTruthy();
  });

  it('records a soft bounce as bounced without suppressing the address', async () => {
    const id = await send('full@example.com');
    await expectLastEvent(id, 'sent');
    const { message_id: messageId } = await getEmail(id);
    await webhook({ type: 'bounced', messageId, bounceType: 'soft', diagnostic: '452 4.2.2 mailbox full' });
    await expectLastEvent(id, 'bounced');
    expect(await sql(`select 1 from suppressions where address = 'full@example.com'`)).toEqual([]);
    const later = await send('full@example.com');
    await expectLastEvent(later, 'sent');
  });

  it('follows trackOpens / trackClicks off', async () => {
    await sql('update organizations set track_opens = false, track_clicks = false where id = ?', [organizationId]);
    try {
      const id = await send('untracked@example.com', LINKS_HTML);
      await expectLastEvent(id, 'sent');
      const html = await receivedHtml((await getEmail(id)).message_id);
      expect(html).not.toContain('/t/');
      expect(hrefs(html)).toContain('https://shop.acme.test/offer?a=1&b=2');
    } finally {
      await sql('update organizations set track_opens = true, track_clicks = true where id = ?', [organizationId]);
    }
  });
});

describe('tracking tokens', () => {
  it('answers 404 to garbage, altered, forged and cross-purpose tokens, and never redirects', async () => {
    const id = await send('tokens@example.com');
    const { signer } = ctx.services;
    const click = clickToken(signer, id, 0, 'https://acme.test/a');
    const [payload, mac] = click.split('.') as [string, string];
    const altered = `${Buffer.from(`${id} 0 https://evil.test/a`).toString('base64url')}.${mac}`;
    const flipped = `${payload}.${mac.slice(0, -1)}${mac.endsWith('A') ? 'B' : 'A'}`;
    const other = new (signer.constructor as new (key: string) => typeof signer)('another-secret-key-another-secret-key');
    for (const url of [
      '/t/c/garbage',
      '/t/c/a.b.c',
      `/t/c/${altered}`,
      `/t/c/${flipped}`,
      `/t/c/${clickToken(other, id, 0, 'https://acme.test/a')}`,
      `/t/c/${openToken(signer, id)}`,
      `/t/o/${click}.gif`,
      `/t/o/${openToken(signer, id)}`,
      '/t/o/nothing.gif',
    ]) {
      const response = await ctx.app.inject({ url });
      expect(response.statusCode, url).toBe(404);
      expect(response.headers.location).toBeUndefined();
      expect(response.json()).toMatchObject({ name: 'not_found', statusCode: 404 });
    }
    expect((await ctx.app.inject({ url: `/t/c/${click}` })).statusCode).toBe(302);
    expect((await ctx.app.inject({ method: 'HEAD', url: `/t/c/${click}` })).statusCode).toBe(302);
    await until(() => eventCount(id), (n) => n === 1);
  });

  it('redirects to a link with non-ASCII characters in its host, path or query in ASCII (a Location header takes no other)', async () => {
    const id = await send('unicode-links@example.com');
    const { signer } = ctx.services;
    for (const [url, location] of [
      ['https://例え.jp/', 'https://xn--r8jz45g.jp/'],
      ['https://example.org/café?q=日本#€', 'https://example.org/caf%C3%A9?q=%E6%97%A5%E6%9C%AC#%E2%82%AC'],
    ] as const) {
      for (const method of ['GET', 'HEAD'] as const) {
        const response = await ctx.app.inject({ method, url: `/t/c/${clickToken(signer, id, 0, url)}` });
        expect(response.statusCode, url).toBe(302);
        expect(response.headers.location).toBe(location);
      }
    }
  });

  it('counts concurrent duplicate hits once: first open, first click and campaign counters', async () => {
    const ids = [await send('a@example.com'), await send('b@example.com')];
    await sql(`insert into campaigns (id, organization_id, name, created_at, updated_at) values ('cmp_test', ?, 'Test', now(), now())`, [organizationId]);
    await sql(`update emails set campaign_id = 'cmp_test', source = 'campaign' where id in (?, ?)`, ids);
    // A test send of the campaign: its opens and clicks are not the campaign's.
    const testSend = await send('tester@example.com');
    await sql(`update emails set campaign_id = 'cmp_test', source = 'test' where id = ?`, [testSend]);
    const { signer } = ctx.services;
    for (const url of [`/t/o/${openToken(signer, testSend)}.gif`, `/t/c/${clickToken(signer, testSend, 0, 'https://acme.test/0')}`]) {
      expect([200, 302]).toContain((await ctx.app.inject({ url })).statusCode);
    }
    await until(() => eventCount(testSend), (n) => n === 2);
    const hits = ids.flatMap((id) => [
      ...Array.from({ length: 20 }, () => ctx.app.inject({ url: `/t/o/${openToken(signer, id)}.gif` })),
      ...Array.from({ length: 20 }, (_, i) => ctx.app.inject({ url: `/t/c/${clickToken(signer, id, i % 2, `https://acme.test/${i % 2}`)}` })),
    ]);
    // And two "processes" writing the same emails' hits at once, each in its own transaction.
    const direct = [0, 1].map(() =>
      ctx.services.orm.em.fork().transactional((em) =>
        writeHits(
          em,
          ids.flatMap((id) => [
            { emailId: id, type: 'open' as const, at: new Date(), ip: null, userAgent: null, url: null },
            { emailId: id, type: 'click' as const, at: new Date(), ip: null, userAgent: null, url: 'https://acme.test/0' },
          ]),
        ),
      ),
    );
    const responses = await Promise.all(hits);
    await Promise.all(direct);
    expect(responses.every((r) => r.statusCode === 200 || r.statusCode === 302)).toBe(true);
    for (const id of ids) await until(() => eventCount(id), (n) => n === 44);
    const rows = await sql<{ first_opened_at: Date | null; first_clicked_at: Date | null }>(
      'select first_opened_at, first_clicked_at from emails where id in (?, ?)',
      ids,
    );
    expect(rows.every((r) => r.first_opened_at && r.first_clicked_at)).toBe(true);
    const [campaign] = await sql(`select emails_opened_count, emails_clicked_count from campaigns where id = 'cmp_test'`);
    expect(campaign).toEqual({ emails_opened_count: 2, emails_clicked_count: 2 });
  });

  it('records the later hits of an email already opened, and its first click once', async () => {
    const id = await send('regular@example.com');
    await sql(`insert into campaigns (id, organization_id, name, created_at, updated_at) values ('cmp_regular', ?, 'Regular', now(), now())`, [organizationId]);
    await sql(`update emails set campaign_id = 'cmp_regular', source = 'campaign' where id = ?`, [id]);
    const { signer } = ctx.services;
    const open = `/t/o/${openToken(signer, id)}.gif`;
    expect((await ctx.app.inject({ url: open })).statusCode).toBe(200);
    await until(() => eventCount(id, 'open'), (n) => n === 1);
    // The process now knows the first open: these opens are written as events alone.
    for (let round = 0; round < 3; round++) {
      await Promise.all(Array.from({ length: 10 }, () => ctx.app.inject({ url: open, headers: { 'user-agent': `Reader/${round}` } })));
    }
    await until(() => eventCount(id, 'open'), (n) => n === 31);
    const click = `/t/c/${clickToken(signer, id, 0, 'https://acme.test/a?b="c"\\d')}`;
    expect((await ctx.app.inject({ url: click })).statusCode).toBe(302);
    await until(() => eventCount(id, 'click'), (n) => n === 1);
    await Promise.all(Array.from({ length: 10 }, () => ctx.app.inject({ url: click })));
    await until(() => eventCount(id, 'click'), (n) => n === 11);
    const [email] = await sql<{ first_opened_at: Date | null; first_clicked_at: Date | null }>('select first_opened_at, first_clicked_at from emails where id = ?', [id]);
    expect(email!.first_opened_at && email!.first_clicked_at).toBeTruthy();
    const [campaign] = await sql(`select emails_opened_count, emails_clicked_count from campaigns where id = 'cmp_regular'`);
    expect(campaign).toEqual({ emails_opened_count: 1, emails_clicked_count: 1 });
    const rows = await sql<{ organization_id: string; user_agent: string | null; url: string | null }>(
      `select organization_id, user_agent, url from email_events where email_id = ? and (type = 'click' or user_agent = 'Reader/2')`,
      [id],
    );
    expect(rows).toHaveLength(21);
    expect(rows.every((r) => r.organization_id === organizationId)).toBe(true);
    expect(rows.filter((r) => r.url === 'https://acme.test/a?b="c"\\d')).toHaveLength(11);
  });

  it('writes every buffered hit when the app closes', async () => {
    const id = await send('shutdown@example.com');
    const app = await buildApp(ctx.services);
    await app.ready();
    const url = `/t/o/${openToken(ctx.services.signer, id)}.gif`;
    await Promise.all(Array.from({ length: 30 }, () => app.inject({ url })));
    await app.close();
    expect(await eventCount(id, 'open')).toBe(30);
  });
});

describe('provider webhook', () => {
  it('answers 401 to a missing, wrong or stale signature and changes nothing', async () => {
    const id = await send('sig@example.com');
    await expectLastEvent(id, 'sent');
    const { message_id: messageId } = await getEmail(id);
    const body = JSON.stringify({ type: 'complained', messageId });
    for (const signature of [null, '', 'sha256=', sign(body, 'wrong-secret'), sign(`${body} `), sign(body).replace('sha256=', 'sha1='), 'sha256=zz']) {
      const response = await webhook(body, signature);
      expect(response.statusCode, String(signature)).toBe(401);
      expect(response.json()).toMatchObject({ statusCode: 401 });
    }
    // Unsigned and invalid: the signature is checked first.
    expect((await webhook({ type: 'nope' }, null)).statusCode).toBe(401);
    expect((await getEmail(id)).last_event).toBe('sent');
    expect(await eventCount(id)).toBe(0);
  });

  it('answers 401 when no secret is configured', async () => {
    const services = { ...ctx.services, config: { ...ctx.services.config, providerWebhookSecret: undefined } };
    const app = await buildApp(services);
    await app.ready();
    try {
      expect((await webhook({ type: 'delivered', messageId: 'x@acme.test' }, undefined, app as typeof ctx.app)).statusCode).toBe(401);
    } finally {
      await app.close();
    }
  });

  it('answers 400 to a signed body that is not JSON, 422 to one that is not an event and 404 to an unknown message id', async () => {
    for (const body of [{ type: 'opened', messageId: 'x@acme.test' }, { type: 'delivered' }, { type: 'bounced', messageId: 'x', bounceType: 'maybe' }, '[]', '"text"']) {
      const response = await webhook(body);
      expect(response.statusCode, JSON.stringify(body)).toBe(422);
      expect(response.json()).toMatchObject({ name: 'validation_error' });
    }
    for (const body of ['not json', '{bad']) {
      const response = await webhook(body);
      expect(response.statusCode, body).toBe(400);
      expect(response.json()).toMatchObject({ name: 'invalid_json', message: 'The body is not valid JSON' });
      // Unsigned, the signature is what is refused.
      expect((await webhook(body, null)).statusCode).toBe(401);
    }
    const unknown = await webhook({ type: 'delivered', messageId: 'eml_nothing@acme.test' });
    expect(unknown.statusCode).toBe(404);
    expect(unknown.json()).toMatchObject({ name: 'not_found' });
  });
});

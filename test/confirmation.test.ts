import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { startWorkers } from '../src/workers/runner.js';
import { buildConfirmationEmail, confirmationToken } from '../src/shared/subscribers/confirmation.js';
import { bearer, type TestContext } from './helpers/context.js';
import { doubleOptInContext, finishedConfirmation, finishedJob as finishedJobOf } from './helpers/double-opt-in.js';
import { until } from './helpers/until.js';

let ctx: TestContext;
let token: string;
let close: (() => Promise<void>) | undefined;

beforeAll(async () => {
  ({ ctx, token, close } = await doubleOptInContext());
});
afterAll(async () => {
  await close?.();
});

function api(method: 'GET' | 'POST' | 'PATCH', url: string, body?: unknown) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(token), ...(body === undefined ? {} : { payload: body as object }) });
}

function finishedJob(id: string) {
  return finishedJobOf(ctx, id);
}

function evidence(id: string) {
  return ctx.services.orm.em
    .fork()
    .execute('select status, confirmed_at, confirm_ip, confirm_user_agent from subscribers where id = ?', [id]) as Promise<Array<Record<string, unknown>>>;
}

describe('buildConfirmationEmail', () => {
  it('builds a subject and HTML holding the link', () => {
    const url = 'https://mail.example.test/confirm/abc.def';
    const email = buildConfirmationEmail({ organization: { name: 'Acme' }, subscriber: { email: 'a@example.com', name: 'Ann' }, confirmUrl: url });
    expect(email.subject).toBe('Confirm your subscription to Acme');
    expect(email.html).toMatch(new RegExp(`<a href="${url.replaceAll('.', '\\.')}"[^>]*>Confirm my subscription</a>`));
    // In the layout every rendered email has.
    expect(email.html).toMatch(/^<!DOCTYPE html>/);
    expect(email.html).toContain('Hello Ann,');
  });

  it('shows a name, organization and address as text: no link, no markup, no stray backslash', () => {
    const email = buildConfirmationEmail({
      organization: { name: 'Acme <b>Inc</b>' },
      subscriber: { email: 'a@example.com', name: 'Win a prize https://3627734734/claim *now* [here](https://evil.example)' },
      confirmUrl: 'https://mail.example.test/confirm/abc',
    });
    expect(email.html).toContain('Hello Win a prize https://3627734734/claim *now* [here](https://evil.example),');
    expect(email.html).toContain('Acme &lt;b&gt;Inc&lt;/b&gt;');
    expect(email.html.match(/<a /g)).toHaveLength(1);
    expect(email.html).not.toContain('\\');
  });
});

describe('double opt-in confirmation (docs/audience.md "Double opt-in")', () => {
  it('the send-confirmation job builds the message with a signed link that confirms with evidence', async () => {
    const s = (await api('POST', '/subscribers', { email: 'confirm-me@example.com', name: 'Cora' })).json();
    expect(s.status).toBe('PENDING_CONFIRMATION');
    const job = await finishedConfirmation(ctx, s.id);
    expect(job?.failedReason).toBeUndefined();
    const { message } = job!.returnvalue as { message: { to: string; subject: string; html: string } };
    expect(message.to).toBe('confirm-me@example.com');
    expect(message.subject).toContain('Acme News');
    const link = /https:\/\/mail\.example\.test\/confirm\/([A-Za-z0-9_.-]+)/.exec(message.html);
    expect(link).not.toBeNull();

    const head = await ctx.app.inject({ method: 'HEAD', url: `/confirm/${link![1]}` });
    expect(head.statusCode).toBe(404);
    expect((await evidence(s.id))[0].status).toBe('PENDING_CONFIRMATION');

    // GET (what a mail scanner or link preview does) shows the button and changes nothing.
    const shown = await ctx.app.inject({ url: `/confirm/${link![1]}`, headers: { 'user-agent': 'Scanner/1.0' } });
    expect(shown.statusCode).toBe(200);
    expect(shown.headers['content-type']).toContain('text/html');
    expect(shown.body).toContain(`<form method="post" action="/confirm/${link![1]}">`);
    expect(shown.body).toContain('confirm-me@example.com');
    expect(await evidence(s.id)).toMatchObject([{ status: 'PENDING_CONFIRMATION', confirmed_at: null, confirm_user_agent: null }]);

    // The button posts the form.
    const page = await ctx.app.inject({
      method: 'POST',
      url: `/confirm/${link![1]}`,
      headers: { 'user-agent': 'MailClient/1.0', 'content-type': 'application/x-www-form-urlencoded' },
      payload: '',
      remoteAddress: '198.51.100.4',
    });
    expect(page.statusCode).toBe(200);
    expect(page.headers['content-type']).toContain('text/html');
    expect(page.body).toContain('Subscription confirmed');
    const [row] = await evidence(s.id);
    expect(row).toMatchObject({ status: 'SUBSCRIBED', confirm_ip: '198.51.100.4', confirm_user_agent: 'MailClient/1.0' });
    expect(row.confirmed_at).not.toBeNull();
    expect((await api('GET', `/subscribers/${s.id}`)).json().status).toBe('SUBSCRIBED');

    const again = await ctx.app.inject({ method: 'POST', url: `/confirm/${link![1]}` });
    expect(again.statusCode).toBe(200);
    expect(again.body).toContain('Already confirmed');
    const shownAgain = await ctx.app.inject({ url: `/confirm/${link![1]}` });
    expect(shownAgain.body).toContain('Already confirmed');
    expect(shownAgain.body).not.toContain('<form');
  });

  it('a forged, altered or other-purpose token is 404 and changes nothing', async () => {
    const s = (await api('POST', '/subscribers', { email: 'forged@example.com' })).json();
    const good = confirmationToken(ctx.services.signer, s);
    const forged = [
      `${good.slice(0, -2)}xx`,
      ctx.services.signer.sign('unsubscribe', `${s.id} ${s.email}`),
      Buffer.from(`${s.id} ${s.email}`).toString('base64url'),
      'nothing',
    ];
    for (const t of forged) {
      for (const method of ['GET', 'POST'] as const) {
        const res = await ctx.app.inject({ method, url: `/confirm/${t}` });
        expect(res.statusCode).toBe(404);
        expect(res.headers['content-type']).toContain('text/html');
      }
    }
    expect((await evidence(s.id))[0].status).toBe('PENDING_CONFIRMATION');
  });

  it('a link does not confirm an address changed since it was sent', async () => {
    const s = (await api('POST', '/subscribers', { email: 'before@example.com' })).json();
    const link = confirmationToken(ctx.services.signer, s);
    await api('PATCH', `/subscribers/${s.id}`, { email: 'after@example.com' });
    expect((await ctx.app.inject({ url: `/confirm/${link}` })).statusCode).toBe(404);
    expect((await ctx.app.inject({ method: 'POST', url: `/confirm/${link}` })).statusCode).toBe(404);
  });

  it('does not re-subscribe a contact that unsubscribed before confirming', async () => {
    const s = (await api('POST', '/subscribers', { email: 'changed-mind@example.com' })).json();
    await api('POST', `/subscribers/${s.id}/unsubscribe`);
    const res = await ctx.app.inject({ method: 'POST', url: `/confirm/${confirmationToken(ctx.services.signer, s)}` });
    expect(res.body).toContain('Nothing to confirm');
    expect((await evidence(s.id))[0].status).toBe('UNSUBSCRIBED');
  });

  it('the job skips a subscriber that is no longer pending', async () => {
    const s = (await api('POST', '/subscribers', { email: 'quick@example.com', skipDoubleOptIn: true })).json();
    await ctx.services.producer.add('subscribers', { name: 'send-confirmation', data: { subscriberId: s.id, owedSince: Date.now() }, jobId: `manual-${s.id}` });
    const job = await finishedJob(`manual-${s.id}`);
    expect(job?.returnvalue).toEqual({ skipped: true });
  });
});

describe('double opt-in end to end through the file transport (issue 3 "done when")', () => {
  it('writes a confirmation .eml whose link confirms the subscriber', async () => {
    const { emailsProcessor } = await import('../src/workers/emails.js');
    const { readFile } = await import('node:fs/promises');
    const { join } = await import('node:path');
    const emailConnection = createRedis(ctx.services.config.redisUrl, 'worker');
    const emailWorkers = await startWorkers(ctx.services, emailConnection, [emailsProcessor]);
    try {
      const created = (await api('POST', '/subscribers', { email: 'eml-confirm@example.com', name: 'Eve' })).json();
      expect(created.status).toBe('PENDING_CONFIRMATION');
      const job = await finishedConfirmation(ctx, created.id);
      const { emailId } = job!.returnvalue as { emailId: string };
      expect(emailId).toMatch(/^eml_/);

      let eml = '';
      const deadline = Date.now() + 10_000;
      while (!eml && Date.now() < deadline) {
        eml = await readFile(join(ctx.services.config.mail.outboxDir, `${emailId}.eml`), 'utf8').catch(() => '');
        if (!eml) await new Promise((r) => setTimeout(r, 50));
      }
      expect(eml).toContain('To: eml-confirm@example.com');
      expect(eml).toMatch(/^From: "?Acme News"? <no-reply@mail\.example\.test>/m);
      // Quoted-printable may fold the link: unfold soft line breaks before looking for it.
      const body = eml.replace(/=\r?\n/g, '').replace(/=3D/g, '=');
      const token = /https:\/\/mail\.example\.test\/confirm\/([A-Za-z0-9_.-]+)/.exec(body)?.[1];
      expect(token).toBeTruthy();

      const page = await ctx.app.inject({ method: 'POST', url: `/confirm/${token}`, headers: { 'user-agent': 'eml-test' } });
      expect(page.statusCode).toBe(200);
      const [row] = await evidence(created.id);
      expect(row).toMatchObject({ status: 'SUBSCRIBED', confirm_user_agent: 'eml-test' });
      // The file is renamed into place before the status write (group-committed) reaches
      // PostgreSQL: the email reads delivered a moment after the file appears.
      const sent = await until(() => api('GET', `/emails/${emailId}`).then((r) => r.json()), (e) => e.last_event === 'delivered', 5_000);
      expect(sent.last_event).toBe('delivered');
    } finally {
      await emailWorkers.close();
      emailConnection.disconnect();
    }
  });
});

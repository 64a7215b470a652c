import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { simpleParser } from 'mailparser';
import nodemailer from 'nodemailer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { startSubmission, type SubmissionListener } from '../src/smtp/server.js';
import { readSubmittedMessage } from '../src/shared/submission/message.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { selfSignedCertificate } from './helpers/tls.js';
import { type TestDnsServer } from './helpers/dns-server.js';
import { dkimResult, startMailRelay } from './helpers/mail-relay.js';
import { runService } from './helpers/process.js';
import { sample } from './helpers/ops-metrics.js';
import { openDialog } from './helpers/smtp-dialog.js';
import { freePort } from './helpers/outages.js';
import { type SmtpSink } from './helpers/smtp-sink.js';
import { until } from './helpers/until.js';

// docs/smtp.md: SMTP submission end to end, with two clients we did not write (nodemailer as
// an application uses it, Python's smtplib), and every kind of bad input refused with its
// reply and nothing stored.

let ctx: TestContext;
let dns: TestDnsServer;
let sink: SmtpSink;
let workers: RunningWorkers;
let listener: SubmissionListener;
let token: string;
const connections: { disconnect(): void }[] = [];

beforeAll(async () => {
  ({ dns, sink, ctx } = await startMailRelay({ SMTP_SUBMISSION_PORT: '0', SMTP_MAX_MESSAGE_BYTES: String(256 * 1024) }));
  const connection = createRedis(ctx.env.config.redisUrl, 'worker');
  connections.push(connection);
  workers = await startWorkers(ctx.services, connection, [emailSendProcessor('emails', { reconcileGraceMs: 60_000 })]);
  ({ token } = await createOrg(ctx.services));
  // A sending domain with its DKIM key published on the test DNS server, VERIFIED.
  const created = (await api('POST', '/domains', { domain: 'acme.test' })).json();
  const dkim = (created.dnsRecords as Array<{ purpose: string; name: string; value: string }>).find((r) => r.purpose === 'dkim')!;
  dns.set(dkim.name, { txt: [dkim.value], ttl: 300 });
  await ctx.services.orm.em.fork().execute(`update domains set status = 'VERIFIED' where id = ?`, [created.id]);
  listener = await startSubmission(ctx.services, { closeTimeoutMs: 200 });
});

afterAll(async () => {
  await listener?.close();
  await workers?.close();
  for (const c of connections) c.disconnect();
  await ctx?.close();
  await sink?.close();
  await dns?.close();
});

function api(method: 'GET' | 'POST' | 'DELETE', url: string, body?: unknown, as = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(as), ...(body === undefined ? {} : { payload: body as object }) });
}

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

async function counts() {
  const [row] = await ctx.services.orm.em.fork().execute<{ emails: string; submissions: string; attachments: string }[]>(
    `select (select count(*) from emails) as emails, (select count(*) from email_submissions) as submissions,
            (select count(*) from email_attachments) as attachments`,
  );
  return row!;
}

function client(pass = token) {
  return nodemailer.createTransport({ host: '127.0.0.1', port: listener.port, secure: false, auth: { user: 'my-app', pass } });
}

describe('SMTP submission (docs/smtp.md)', () => {
  it('nodemailer submits a message with an attachment: stored, delivered intact, signed, tracked, listed', async () => {
    const acceptedBefore = sample(await ctx.services.metrics.registry.metrics(), 'mailroom_emails_accepted_total', { source: 'smtp' }) ?? 0;
    const pdf = randomBytes(40_000);
    const logo = randomBytes(3_000);
    const transport = client();
    const info = await transport.sendMail({
      from: 'Acme Billing <billing@acme.test>',
      to: ['Jane Doe <jane@example.com>', 'joe@example.com'],
      cc: 'boss@example.com',
      bcc: 'audit@example.com',
      replyTo: 'help@acme.test',
      subject: 'Your invoice ✓',
      text: 'Your invoice is attached.',
      html: '<p>Your invoice is attached. <a href="https://acme.test/account">Account</a></p><img src="cid:logo@acme.test" alt="Acme">',
      headers: { 'X-Mailroom-Tags': 'kind=invoice, plan=pro', 'X-App-Request': 'req-42' },
      attachments: [
        { filename: 'invoice.pdf', content: pdf, contentType: 'application/pdf' },
        { filename: 'logo.png', content: logo, contentType: 'image/png', cid: 'logo@acme.test' },
      ],
    });
    transport.close();
    const id = /^250 2\.0\.0 OK (eml_[0-9a-z]{26})$/.exec(info.response)?.[1];
    expect(id, info.response).toBeDefined();
    expect(sample(await ctx.services.metrics.registry.metrics(), 'mailroom_emails_accepted_total', { source: 'smtp' })).toBe(acceptedBefore + 1);

    const email = await until(() => api('GET', `/emails/${id}`).then((r) => r.json()), (e) => e.last_event === 'sent');
    expect(email).toMatchObject({
      from: 'Acme Billing <billing@acme.test>',
      to: ['Jane Doe <jane@example.com>'],
      cc: ['joe@example.com', 'boss@example.com'],
      bcc: ['audit@example.com'],
      reply_to: ['help@acme.test'],
      subject: 'Your invoice ✓',
      text: 'Your invoice is attached.',
      tags: [
        { name: 'kind', value: 'invoice' },
        { name: 'plan', value: 'pro' },
      ],
      // In the order of the message's parts (nodemailer puts the inline image with the HTML).
      attachments: [
        { filename: 'logo.png', content_type: 'image/png', size: logo.length },
        { filename: 'invoice.pdf', content_type: 'application/pdf', size: pdf.length },
      ],
      message_id: `${id}@acme.test`,
    });
    const listed = (await api('GET', '/emails')).json();
    expect(listed.data.map((e: { id: string }) => e.id)).toContain(id);

    const index = sink.messages.findIndex((m) => m.messageId === `<${id}@acme.test>`);
    expect(index).toBeGreaterThanOrEqual(0);
    const mail = sink.messages[index]!;
    const raw = sink.raw[index]!;
    // Every envelope recipient, the Bcc one included, and nobody else.
    expect([...sink.envelopes[index]!].sort()).toEqual(['audit@example.com', 'boss@example.com', 'jane@example.com', 'joe@example.com']);
    // Headers as submitted, less Bcc and the service's own instruction.
    expect(mail.headers.get('x-app-request')).toBe('req-42');
    expect(mail.headers.has('bcc')).toBe(false);
    expect(mail.headers.has('x-mailroom-tags')).toBe(false);
    expect(raw.toString('latin1')).not.toContain('audit@example.com');
    expect((mail.to as { value: Array<{ address: string }> }).value.map((a) => a.address)).toEqual(['jane@example.com', 'joe@example.com']);
    expect((mail.cc as { value: Array<{ address: string }> }).value.map((a) => a.address)).toEqual(['boss@example.com']);
    expect(mail.subject).toBe('Your invoice ✓');
    // The attachment byte for byte.
    expect(mail.attachments).toHaveLength(2);
    const [invoice, image] = [...mail.attachments].sort((a, b) => (a.filename ?? '').localeCompare(b.filename ?? ''));
    expect(invoice!.filename).toBe('invoice.pdf');
    expect(sha256(invoice!.content)).toBe(sha256(pdf));
    // The inline image keeps its Content-ID, and the HTML still refers to it.
    expect(image).toMatchObject({ filename: 'logo.png', cid: 'logo@acme.test', contentDisposition: 'inline' });
    expect(sha256(image!.content)).toBe(sha256(logo));
    expect((await simpleParser(raw, { keepCidLinks: true })).html).toContain('src="cid:logo@acme.test"');
    // Tracked as API email is (the organization's defaults), and DKIM-signed over that.
    expect(mail.html).toContain('/t/o/');
    expect(mail.html).toContain('/t/c/');
    expect(mail.html).not.toContain('href="https://acme.test/account"');
    const dkim = await dkimResult(dns, raw);
    expect(dkim?.signingDomain).toBe('acme.test');
    expect(dkim?.status.result).toBe('pass');
  });

  it("Python's smtplib submits a message with an attachment (AUTH LOGIN) that arrives intact", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'mailroom-smtplib-'));
    const file = join(dir, 'report.pdf');
    const pdf = randomBytes(25_000);
    await writeFile(file, pdf);
    const script = `
import os, smtplib, sys
from email.message import EmailMessage
msg = EmailMessage()
msg['From'] = 'Reports <reports@acme.test>'
msg['To'] = 'ops@example.com'
msg['Subject'] = 'Nightly report'
msg['X-Mailroom-Tags'] = 'kind=report'
msg.set_content('The nightly report is attached.')
msg.add_alternative('<p>The nightly <b>report</b> is attached.</p>', subtype='html')
with open(sys.argv[1], 'rb') as f:
    msg.add_attachment(f.read(), maintype='application', subtype='pdf', filename='report.pdf')
with smtplib.SMTP('127.0.0.1', int(os.environ['SMTP_PORT']), timeout=10) as s:
    s.ehlo()
    s.esmtp_features['auth'] = 'LOGIN'
    s.login('reports-app', os.environ['SMTP_TOKEN'])
    s.send_message(msg)
print('sent')
`;
    const { stdout } = await promisify(execFile)('python3', ['-c', script, file], {
      env: { ...process.env, SMTP_PORT: String(listener.port), SMTP_TOKEN: token },
      timeout: 20_000,
    });
    expect(stdout.trim()).toBe('sent');

    const listed = await until(
      () => api('GET', '/emails').then((r) => r.json() as Promise<{ data: Array<{ id: string; subject: string; last_event: string }> }>),
      (l) => l.data.some((e) => e.subject === 'Nightly report' && e.last_event === 'sent'),
    );
    const id = listed.data.find((e) => e.subject === 'Nightly report')!.id;
    const email = (await api('GET', `/emails/${id}`)).json();
    expect(email).toMatchObject({
      from: 'Reports <reports@acme.test>',
      to: ['ops@example.com'],
      tags: [{ name: 'kind', value: 'report' }],
      attachments: [{ filename: 'report.pdf', content_type: 'application/pdf', size: pdf.length }],
    });
    const index = sink.messages.findIndex((m) => m.messageId === `<${id}@acme.test>`);
    const mail = sink.messages[index]!;
    expect(sha256(mail.attachments[0]!.content)).toBe(sha256(pdf));
    expect(mail.text?.trim()).toBe('The nightly report is attached.');
    expect(mail.html).toContain('<b>report</b>');
    expect((await dkimResult(dns, sink.raw[index]!))?.status.result).toBe('pass');
  });

  it('a message without a To address keeps its own To header and goes to the envelope only', async () => {
    const dialog = await openDialog(listener.port);
    await dialog.send('EHLO client.test');
    expect(await dialog.auth(token)).toMatch(/^235 /);
    expect(await dialog.send('MAIL FROM:<app@acme.test>')).toMatch(/^250 /);
    expect(await dialog.send('RCPT TO:<hidden1@example.com>')).toMatch(/^250 /);
    expect(await dialog.send('RCPT TO:<hidden2@example.com>')).toMatch(/^250 /);
    expect(await dialog.send('DATA')).toMatch(/^354 /);
    dialog.write('From: app@acme.test\r\nTo: undisclosed-recipients:;\r\nSubject: Quiet\r\n\r\nplain text only\r\n.\r\n');
    const reply = await dialog.reply();
    dialog.close();
    const id = /^250 2\.0\.0 OK (eml_\w+)$/.exec(reply)?.[1];
    expect(id, reply).toBeDefined();
    const email = await until(() => api('GET', `/emails/${id}`).then((r) => r.json()), (e) => e.last_event === 'sent');
    expect(email).toMatchObject({ to: ['hidden1@example.com'], cc: null, bcc: ['hidden2@example.com'], html: null, attachments: [] });
    const index = sink.messages.findIndex((m) => m.messageId === `<${id}@acme.test>`);
    expect([...sink.envelopes[index]!].sort()).toEqual(['hidden1@example.com', 'hidden2@example.com']);
    const raw = sink.raw[index]!.toString();
    expect(raw).toMatch(/^To: "?undisclosed-recipients"?:;\r?$/m);
    expect(raw).not.toContain('hidden');
    expect(sink.messages[index]!.html).toBe(false);
  });

  it('API email answers an empty attachments list; attachments go with their email', async () => {
    const sent = (await api('POST', '/emails', { from: 'a@acme.test', to: 'x@example.com', subject: 'API', html: '<p>hi</p>' })).json();
    expect((await api('GET', `/emails/${sent.id}`)).json().attachments).toEqual([]);

    const transport = client();
    const info = await transport.sendMail({ from: 'a@acme.test', to: 'y@example.com', subject: 'Gone', text: 'x', attachments: [{ filename: 'a.txt', content: 'abc' }] });
    transport.close();
    const id = /OK (eml_\w+)/.exec(info.response)![1]!;
    const em = ctx.services.orm.em.fork();
    const before = await em.execute<{ n: string }[]>('select count(*) as n from email_attachments where email_id = ?', [id]);
    expect(Number(before[0]!.n)).toBe(1);
    await until(() => api('GET', `/emails/${id}`).then((r) => r.json()), (e) => e.last_event === 'sent');
    await em.execute('delete from emails where id = ?', [id]);
    const after = await em.execute<{ a: string; s: string }[]>(
      'select (select count(*) from email_attachments where email_id = ?) as a, (select count(*) from email_submissions where email_id = ?) as s',
      [id, id],
    );
    expect(after[0]).toEqual({ a: '0', s: '0' });
  });
});

describe('bad input gets its reply and stores nothing', () => {
  async function session() {
    const dialog = await openDialog(listener.port);
    await dialog.send('EHLO client.test');
    return dialog;
  }

  async function submit(data: string | Buffer, rcpts = ['r@example.com']) {
    const dialog = await session();
    expect(await dialog.auth(token)).toMatch(/^235 /);
    expect(await dialog.send('MAIL FROM:<app@acme.test>')).toMatch(/^250 /);
    for (const r of rcpts) expect(await dialog.send(`RCPT TO:<${r}>`)).toMatch(/^250 /);
    expect(await dialog.send('DATA')).toMatch(/^354 /);
    dialog.write(data);
    dialog.write('\r\n.\r\n');
    const reply = await dialog.reply();
    dialog.close();
    return reply;
  }

  it('a wrong token, a token without "emails", and no AUTH at all', async () => {
    const before = await counts();
    const wrong = await session();
    expect(await wrong.auth(`svc_${'0'.repeat(64)}`)).toMatch(/^535 5\.7\.8 /);
    expect(await wrong.send('MAIL FROM:<app@acme.test>')).toMatch(/^530 5\.7\.0 /);
    wrong.close();

    const created = await api('POST', '/tokens', { name: 'subscribers only', permissions: ['subscribers'] });
    const limited = await session();
    expect(await limited.auth(created.json().token)).toMatch(/^535 5\.7\.8 /);
    limited.close();

    const anonymous = await session();
    expect(await anonymous.send('MAIL FROM:<app@acme.test>')).toMatch(/^530 5\.7\.0 /);
    expect(await anonymous.send('RCPT TO:<r@example.com>')).toMatch(/^530 5\.7\.0 /);
    anonymous.close();

    // nodemailer sees the refusal as an authentication error.
    await expect(client('svc_nope').sendMail({ from: 'a@acme.test', to: 'r@example.com', text: 'x' })).rejects.toMatchObject({ code: 'EAUTH', responseCode: 535 });
    expect(await counts()).toEqual(before);
  });

  it('takes a recipient at an internationalized domain, in its xn-- form or in Unicode, as the API does', async () => {
    const reply = await submit('From: app@acme.test\r\nTo: Anna <anna@xn--mnchen-3ya.de>\r\nSubject: idn\r\n\r\nhello', ['anna@xn--mnchen-3ya.de', 'bert@münchen.de']);
    expect(reply).toMatch(/^250 /);
    const id = /eml_[0-9a-z]{26}/.exec(reply)![0];
    const email = (await api('GET', `/emails/${id}`)).json();
    expect(email.to).toEqual(['Anna <anna@xn--mnchen-3ya.de>']);
    expect(email.bcc).toEqual(['bert@xn--mnchen-3ya.de']);
    // The envelope the relay is given is in ASCII too (a relay without SMTPUTF8 refuses the Unicode form).
    const [kept] = await ctx.services.orm.em.fork().execute<{ envelope_to: string[] }[]>('select envelope_to from email_submissions where email_id = ?', [id]);
    expect(kept!.envelope_to).toEqual(['anna@xn--mnchen-3ya.de', 'bert@xn--mnchen-3ya.de']);
  });

  it('keeps an attachment\'s type as submitted, and gives none a file name it did not have', async () => {
    const message = [
      'From: app@acme.test',
      'To: files@example.com',
      'Subject: files',
      'MIME-Version: 1.0',
      'Content-Type: multipart/mixed; boundary=XX',
      '',
      '--XX',
      'Content-Type: text/plain',
      '',
      'hi',
      '--XX',
      'Content-Type: application/octet-stream; name="report.pdf"',
      'Content-Disposition: attachment; filename="report.pdf"',
      'Content-Transfer-Encoding: base64',
      '',
      Buffer.from('hello pdf').toString('base64'),
      '--XX',
      'Content-Type: application/octet-stream',
      'Content-Transfer-Encoding: base64',
      '',
      Buffer.from('noname').toString('base64'),
      '--XX--',
    ].join('\r\n');
    const reply = await submit(message, ['files@example.com']);
    const id = /eml_[0-9a-z]{26}/.exec(reply)![0];
    const email = await until(() => api('GET', `/emails/${id}`).then((r) => r.json()), (e) => e.last_event === 'sent');
    expect(email.attachments).toEqual([
      { filename: 'report.pdf', content_type: 'application/octet-stream', size: 9 },
      { filename: null, content_type: 'application/octet-stream', size: 6 },
    ]);
    const raw = sink.raw[sink.messages.findIndex((m) => m.messageId === `<${id}@acme.test>`)]!.toString('latin1');
    expect(raw).toContain('Content-Type: application/octet-stream; name=report.pdf');
    expect(raw).not.toMatch(/attachment-\d/);
  });

  it("keeps a calendar invitation beside the text and HTML, and every part's Content-Type parameters", async () => {
    const transport = client();
    const calendar = 'BEGIN:VCALENDAR\r\nMETHOD:REQUEST\r\nBEGIN:VEVENT\r\nSUMMARY:Kick-off\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n';
    const latin1 = Buffer.from('caf\xe9;na\xefve\r\n', 'latin1');
    const info = await transport.sendMail({
      from: 'app@acme.test',
      to: 'invitee@example.com',
      subject: 'Kick-off',
      text: 'You are invited.',
      html: '<p>You are invited.</p>',
      // As Outlook and Google Calendar send an invitation: in multipart/alternative, no disposition.
      icalEvent: { method: 'REQUEST', content: calendar },
      amp: '<!doctype html><html ⚡4email><body>You are invited.</body></html>',
      attachments: [{ filename: 'data.csv', content: latin1, contentType: 'text/csv; charset=iso-8859-1' }],
    });
    transport.close();
    const id = /eml_[0-9a-z]{26}/.exec(info.response)![0];
    const email = await until(() => api('GET', `/emails/${id}`).then((r) => r.json()), (e) => e.last_event === 'sent');
    // The API lists media types, as it did.
    expect(email.attachments).toEqual([
      { filename: null, content_type: 'text/x-amp-html', size: expect.any(Number) },
      { filename: null, content_type: 'text/calendar', size: Buffer.byteLength(calendar) },
      { filename: 'data.csv', content_type: 'text/csv', size: latin1.length },
      // nodemailer attaches the invitation as a file too.
      { filename: 'invite.ics', content_type: 'application/ics', size: Buffer.byteLength(calendar) },
    ]);
    const raw = sink.raw[sink.messages.findIndex((m) => m.messageId === `<${id}@acme.test>`)]!.toString('latin1');
    // The invitation is a part of the alternative, with its method and charset, not an attachment.
    const alternative = /Content-Type: multipart\/alternative;\s+boundary="([^"]+)"/.exec(raw);
    expect(alternative, raw).not.toBeNull();
    const parts = raw.split(`--${alternative![1]}`).slice(1, -1);
    // AMP before the HTML (a client that shows only the last part it knows finds the HTML).
    expect(parts.map((p) => /Content-Type: ([^;\r\n]+)/.exec(p)?.[1])).toEqual(['text/plain', 'text/x-amp-html', 'text/html', 'text/calendar']);
    expect(parts[3]).toMatch(/Content-Type: text\/calendar; charset=utf-8; method=REQUEST/);
    expect(parts[3]).not.toMatch(/Content-Disposition/);
    // The CSV keeps its charset, and its bytes.
    expect(raw).toMatch(/Content-Type: text\/csv; charset=iso-8859-1; name=data\.csv/);
    const delivered = await simpleParser(sink.raw[sink.messages.findIndex((m) => m.messageId === `<${id}@acme.test>`)]!);
    expect(delivered.attachments.find((a) => a.filename === 'data.csv')!.content.equals(latin1)).toBe(true);
  });

  it('more than 50 Cc or Reply-To addresses: 554 5.6.0, as the API refuses them', async () => {
    const before = await counts();
    const many = (n: number, at: string) => Array.from({ length: n }, (_, i) => `c${i}@${at}`).join(',\r\n ');
    expect(await submit(`From: app@acme.test\r\nTo: r@example.com\r\nCc: ${many(51, 'example.com')}\r\nSubject: cc\r\n\r\nx`)).toMatch(/^554 5\.6\.0 To and Cc: at most 51 addresses/);
    expect(await submit(`From: app@acme.test\r\nTo: r@example.com\r\nReply-To: ${many(51, 'acme.test')}\r\nSubject: rt\r\n\r\nx`)).toMatch(/^554 5\.6\.0 Reply-To: at most 50 addresses/);
    expect(await counts()).toEqual(before);
    // 50 of each is the API's limit, and taken.
    const reply = await submit(`From: app@acme.test\r\nTo: r@example.com\r\nCc: ${many(50, 'example.com')}\r\nReply-To: ${many(50, 'acme.test')}\r\nSubject: fifty\r\n\r\nx`);
    expect(reply).toMatch(/^250 /);
    const email = (await api('GET', `/emails/${/eml_[0-9a-z]{26}/.exec(reply)![0]}`)).json();
    expect([email.cc.length, email.reply_to.length]).toEqual([50, 50]);
  });

  it('too many recipients: 452 4.5.3 past 50', async () => {
    const dialog = await session();
    await dialog.auth(token);
    await dialog.send('MAIL FROM:<app@acme.test>');
    for (let i = 0; i < 50; i++) expect(await dialog.send(`RCPT TO:<r${i}@example.com>`)).toMatch(/^250 /);
    expect(await dialog.send('RCPT TO:<r50@example.com>')).toMatch(/^452 4\.5\.3 /);
    // A recipient already given is not a new one.
    expect(await dialog.send('RCPT TO:<r0@example.com>')).toMatch(/^250 /);
    expect(await dialog.send('RCPT TO:<not an address>')).toMatch(/^5\d\d /);
    dialog.close();
  });

  it('too large: 552 5.3.4 at MAIL SIZE= and after DATA', async () => {
    const before = await counts();
    const dialog = await session();
    await dialog.auth(token);
    expect(await dialog.send(`MAIL FROM:<app@acme.test> SIZE=${256 * 1024 + 1}`)).toMatch(/^552 5\.3\.4 /);
    dialog.close();
    const big = `From: app@acme.test\r\nTo: r@example.com\r\nSubject: big\r\n\r\n${'x'.repeat(900).concat('\r\n').repeat(300)}`;
    expect(await submit(big)).toMatch(/^552 5\.3\.4 /);
    expect(await counts()).toEqual(before);
  });

  it('a From domain the organization may not use: 550 5.7.1', async () => {
    const before = await counts();
    const reply = await submit('From: someone@elsewhere.test\r\nTo: r@example.com\r\nSubject: spoof\r\n\r\nhello');
    expect(reply).toMatch(/^550 5\.7\.1 .*elsewhere\.test/);
    const transport = client();
    await expect(transport.sendMail({ from: 'x@unverified.test', to: 'r@example.com', text: 'x' })).rejects.toMatchObject({ responseCode: 550 });
    transport.close();
    // A From of the organization's, but sent "by" or resent from another domain: refused too.
    expect(await submit('From: app@acme.test\r\nSender: ceo@elsewhere.test\r\nTo: r@example.com\r\nSubject: by\r\n\r\nhello')).toMatch(/^550 5\.7\.1 Sender: .*elsewhere\.test/);
    expect(await submit('From: app@acme.test\r\nResent-From: Boss <boss@elsewhere.test>\r\nTo: r@example.com\r\nSubject: resent\r\n\r\nhello')).toMatch(/^550 5\.7\.1 Resent-From: .*elsewhere\.test/);
    expect(await submit('From: app@acme.test\r\nResent-Sender: x@elsewhere.test\r\nTo: r@example.com\r\nSubject: resent\r\n\r\nhello')).toMatch(/^550 5\.7\.1 Resent-Sender: .*elsewhere\.test/);
    expect(await counts()).toEqual(before);
    // The organization's own domain in them is sent as any message is.
    expect(await submit('From: app@acme.test\r\nSender: ops@acme.test\r\nResent-Sender: x@ACME.test\r\nTo: r@example.com\r\nSubject: own\r\n\r\nhello')).toMatch(/^250 /);
  });

  it('malformed messages: no From, two From addresses, a line or a Subject over 998 characters, bad tags', async () => {
    const before = await counts();
    expect(await submit('this is not a message at all')).toMatch(/^554 5\.6\.0 /);
    expect(await submit('From: a@acme.test, b@acme.test\r\nSubject: two\r\n\r\nx')).toMatch(/^554 5\.6\.0 /);
    expect(await submit(`From: a@acme.test\r\nSubject: long\r\n\r\n${'y'.repeat(999)}`)).toMatch(/^554 5\.6\.0 .*998/);
    expect(await submit('From: a@acme.test\r\nX-Mailroom-Tags: bad tag=1\r\nSubject: tags\r\n\r\nx')).toMatch(/^554 5\.6\.0 X-Mailroom-Tags/);
    // HTML nested deeper than the API takes (tracking parses it).
    const deepHtml = `From: a@acme.test\r\nSubject: deep\r\nContent-Type: text/html\r\n\r\n${'<div>\r\n'.repeat(1_001)}x`;
    expect(await submit(deepHtml)).toMatch(/^554 5\.6\.0 Message HTML is nested deeper than 1000 elements/);
    // A folded Subject past the API's 998 characters, no line of it over 998.
    const folded = `Subject: ${Array.from({ length: 20 }, () => 's'.repeat(79)).join('\r\n ')}`;
    expect(await submit(`From: a@acme.test\r\n${folded}\r\n\r\nx`)).toMatch(/^554 5\.6\.0 Subject is longer than 998/);
    // A multipart body without its boundary: no part of it can be found (it was taken, empty).
    const unbounded = 'From: a@acme.test\r\nSubject: parts\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed\r\n\r\n--x\r\nContent-Type: text/plain\r\n\r\nhi\r\n--x--\r\n';
    expect(await submit(unbounded)).toMatch(/^554 5\.6\.0 Content-Type multipart\/mixed has no boundary/);
    // The same inside: a multipart/alternative part without its boundary in a multipart/mixed.
    const innerUnbounded = [
      'From: a@acme.test', 'Subject: inner', 'MIME-Version: 1.0', 'Content-Type: multipart/mixed; boundary="outer"', '',
      '--outer', 'Content-Type: multipart/alternative', '', '--inner', 'Content-Type: text/plain', '', 'hi', '--inner--', '--outer--', '',
    ].join('\r\n');
    expect(await submit(innerUnbounded)).toMatch(/^554 5\.6\.0 Message has a multipart part without its boundary/);
    expect(await counts()).toEqual(before);
    // Empty messages are no such thing: a multipart with one empty text part (Python's
    // MIMEMultipart() with MIMEText('')), an empty quoted-printable body.
    const emptyPart = ['From: app@acme.test', 'To: r@example.com', 'Subject: empty part', 'MIME-Version: 1.0', 'Content-Type: multipart/mixed; boundary="b"', '', '--b', 'Content-Type: text/plain', '', '', '--b--', ''].join('\r\n');
    expect(await submit(emptyPart)).toMatch(/^250 2\.0\.0 OK eml_/);
    const softBreak = ['From: app@acme.test', 'To: r@example.com', 'Subject: qp', 'Content-Type: text/plain', 'Content-Transfer-Encoding: quoted-printable', '', '='].join('\r\n');
    expect(await submit(softBreak)).toMatch(/^250 2\.0\.0 OK eml_/);
    // An HTML-only message has no text part: text is null, as html is for a text-only one.
    const htmlOnly = await submit('From: app@acme.test\r\nTo: r@example.com\r\nSubject: html only\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>Hello</p>');
    expect((await api('GET', `/emails/${/eml_[0-9a-z]{26}/.exec(htmlOnly)![0]}`)).json()).toMatchObject({ html: '<p>Hello</p>\n', text: null });
    // No Subject at all: taken, with an empty subject.
    const untitled = await submit('From: app@acme.test\r\nTo: r@example.com\r\n\r\nno subject');
    expect(untitled).toMatch(/^250 2\.0\.0 OK eml_/);
    expect((await api('GET', `/emails/${/eml_[0-9a-z]{26}/.exec(untitled)![0]}`)).json().subject).toBe('');
  });

  it('a client that disconnects mid-DATA leaves nothing, and the listener keeps serving', async () => {
    const before = await counts();
    const dialog = await session();
    await dialog.auth(token);
    await dialog.send('MAIL FROM:<app@acme.test>');
    await dialog.send('RCPT TO:<r@example.com>');
    expect(await dialog.send('DATA')).toMatch(/^354 /);
    dialog.write('From: app@acme.test\r\nTo: r@example.com\r\nSubject: cut\r\n\r\nhalf a mes');
    await new Promise((r) => setTimeout(r, 50));
    dialog.close();
    await dialog.closed;
    await new Promise((r) => setTimeout(r, 100));
    expect(await counts()).toEqual(before);
    const reply = await submit('From: app@acme.test\r\nTo: r@example.com\r\nSubject: after\r\n\r\nstill here');
    expect(reply).toMatch(/^250 2\.0\.0 OK eml_/);
  });
});

describe('limits that need their own settings', () => {
  let other: TestContext;
  let otherListener: SubmissionListener;
  let tlsListener: SubmissionListener;
  let otherToken: string;

  beforeAll(async () => {
    const tls = await selfSignedCertificate('smtp-tls');
    other = await createTestContext({
      NODE_ENV: 'production',
      RATE_LIMIT_PER_SECOND: '2',
      SMTP_SUBMISSION_PORT: '0',
      SMTP_SUBMISSION_TLS_PORT: '0',
      SMTP_TLS_CERT_FILE: tls.certFile,
      SMTP_TLS_KEY_FILE: tls.keyFile,
      ALLOW_UNVERIFIED_DOMAINS: 'true',
    });
    ({ token: otherToken } = await createOrg(other.services));
    otherListener = await startSubmission(other.services, { closeTimeoutMs: 200 });
    tlsListener = otherListener;
  });
  afterAll(async () => {
    await otherListener?.close();
    await other?.close();
  });

  it('in production, AUTH is neither offered nor taken before STARTTLS (no credential is asked for); after STARTTLS it works, and implicit TLS too', async () => {
    const dialog = await openDialog(otherListener.port);
    const ehlo = await dialog.send('EHLO client.test');
    expect(ehlo).toContain('STARTTLS');
    expect(ehlo).not.toContain('AUTH');
    // Refused at once: no 334 asking for the user name and the token.
    expect(await dialog.send('AUTH LOGIN')).toMatch(/^500 /);
    expect(await dialog.send('MAIL FROM:<a@acme.test>')).toMatch(/^530 5\.7\.0 Must issue a STARTTLS command first/);
    expect(await dialog.send('STARTTLS')).toMatch(/^220 /);
    await dialog.startTls();
    expect(await dialog.send('EHLO client.test')).toContain('AUTH PLAIN LOGIN');
    expect(await dialog.auth(otherToken)).toMatch(/^235 /);
    dialog.close();

    const implicit = nodemailer.createTransport({ host: '127.0.0.1', port: tlsListener.tlsPort!, secure: true, tls: { rejectUnauthorized: false }, auth: { user: 'x', pass: otherToken } });
    const info = await implicit.sendMail({ from: 'a@acme.test', to: 'r@example.com', subject: 'tls', text: 'over implicit TLS' });
    implicit.close();
    expect(info.response).toMatch(/^250 2\.0\.0 OK eml_/);
  });

  it('past the per-token rate limit: 421 4.7.0', async () => {
    const transport = nodemailer.createTransport({ host: '127.0.0.1', port: otherListener.port, requireTLS: true, tls: { rejectUnauthorized: false }, auth: { user: 'x', pass: otherToken } });
    // Aligned on a fresh second: the limit (2 a second) is counted in one window.
    await new Promise((r) => setTimeout(r, 1000 - (Date.now() % 1000) + 20));
    const results = await Promise.allSettled(
      Array.from({ length: 4 }, (_, i) => transport.sendMail({ from: 'a@acme.test', to: 'r@example.com', subject: `n${i}`, text: 'x' })),
    );
    transport.close();
    const refused = results.filter((r) => r.status === 'rejected').map((r) => (r as PromiseRejectedResult).reason as { response?: string });
    expect(refused.length).toBeGreaterThanOrEqual(2);
    for (const reason of refused) expect(reason.response).toMatch(/^421 4\.7\.0 /);
  });
});

describe('the Procfile role smtp (npm run start:smtp)', () => {
  it('listens on the port it logs, takes a message, serves its health and metrics, and exits 0 on SIGTERM', async () => {
    const metricsPort = await freePort();
    const proc = runService('src/smtp/main.ts', [], { ...ctx.env.env, LOG_LEVEL: 'info', WORKER_METRICS_PORT: String(metricsPort) });
    try {
      const match = await proc.waitFor(/SMTP submission listening on 127\.0\.0\.1:(\d+)/, 40_000);
      const transport = nodemailer.createTransport({ host: '127.0.0.1', port: Number(match[1]), auth: { user: 'role', pass: token } });
      const info = await transport.sendMail({ from: 'role@acme.test', to: 'r@example.com', subject: 'from the role', text: 'x' });
      transport.close();
      const id = /OK (eml_\w+)/.exec(info.response)![1]!;
      expect((await api('GET', `/emails/${id}`)).json().subject).toBe('from the role');
      // This process's own count of what it accepted, where Prometheus can scrape it.
      await proc.waitFor(/metrics listening/, 10_000);
      await expectProbes(metricsPort, /^mailroom_emails_accepted_total\{source="smtp"\} 1$/m);
      proc.child.kill('SIGTERM');
      expect(await proc.exited).toBe(0);
    } finally {
      proc.kill();
    }
    // Starting a TypeScript process takes long on a loaded machine.
  }, 60_000);

  it('the inbound role serves its health and its refused-recipient count on WORKER_METRICS_PORT', async () => {
    const metricsPort = await freePort();
    const proc = runService('src/inbound/main.ts', [], { ...ctx.env.env, LOG_LEVEL: 'info', INBOUND_SMTP_PORT: '0', WORKER_METRICS_PORT: String(metricsPort) });
    try {
      const match = await proc.waitFor(/inbound SMTP listening on 127\.0\.0\.1:(\d+)/, 40_000);
      await proc.waitFor(/metrics listening/, 10_000);
      const dialog = await openDialog(Number(match[1]));
      await dialog.send('EHLO client.test');
      await dialog.send('MAIL FROM:<>');
      expect(await dialog.send('RCPT TO:<nobody@nowhere.test>')).toMatch(/^550 /);
      dialog.close();
      await expectProbes(metricsPort, /^mailroom_inbound_reports_total\{outcome="refused"\} 1$/m);
      // Stopped as a Procfile role is (SIGTERM to its node process), and it exits 0.
      proc.child.kill('SIGTERM');
      expect(await proc.exited).toBe(0);
    } finally {
      proc.kill();
    }
  }, 60_000);
});

/** A role's liveness, readiness and one of its metrics, on its WORKER_METRICS_PORT. */
async function expectProbes(port: number, metric: RegExp): Promise<void> {
  const base = `http://127.0.0.1:${port}`;
  expect((await fetch(`${base}/healthz`)).status).toBe(200);
  expect((await fetch(`${base}/readyz`)).status).toBe(200);
  expect(await (await fetch(`${base}/metrics`)).text()).toMatch(metric);
}

describe('reading a message (docs/smtp.md "From a message to an email")', () => {
  it('decodes names, keeps groups in To, maps to, cc and bcc, and reads 8-bit headers as UTF-8', async () => {
    const raw = Buffer.from(
      'From: =?UTF-8?Q?J=C3=B6_Smith?= <jo@acme.test>\r\nTo: undisclosed-recipients:;, Team: a@x.test, "B, C" <b@x.test>;\r\n' +
        'Cc: "Quote \\"me\\"" <q@x.test>\r\nSender: =?UTF-8?B?U8O2bmRlcg==?= <s@acme.test>\r\nX-Utf: caf\xc3\xa9\r\nBcc: secret@x.test\r\n' +
        'Subject: =?UTF-8?Q?caf=C3=A9?=\r\nMessage-ID: <client@acme.test>\r\n\r\nbody\r\n',
      'latin1',
    );
    const message = await readSubmittedMessage(raw, ['a@x.test', 'z@x.test', 'secret@x.test']);
    expect(message).toMatchObject({
      from: 'Jö Smith <jo@acme.test>',
      to: 'a@x.test',
      cc: ['"B, C" <b@x.test>', '"Quote \\"me\\"" <q@x.test>'],
      bcc: ['z@x.test', 'secret@x.test'],
      subject: 'café',
      html: '',
      text: 'body\n',
    });
    expect(message.headers).toEqual([
      ['X-Utf', 'café'],
      ['To', 'undisclosed-recipients:;, Team: a@x.test, "B, C" <b@x.test>;'],
      ['Cc', '"Quote \\"me\\"" <q@x.test>'],
      ['Sender', 'Sönder <s@acme.test>'],
    ]);
  });
});

describe('a revoked token (docs/foundation.md "Authentication and rate limiting")', () => {
  it('is refused on SMTP within 2 seconds of DELETE /api/v2/tokens/{id}', async () => {
    const created = (await api('POST', '/tokens', { name: 'smtp app', permissions: ['emails'] })).json();
    const first = await openDialog(listener.port);
    await first.send('EHLO client.test');
    expect(await first.auth(created.token)).toMatch(/^235 /);
    first.close();
    const deleted = await ctx.app.inject({ method: 'DELETE', url: `/api/v2/tokens/${created.id}`, headers: bearer(token) });
    expect(deleted.statusCode).toBe(200);
    const started = Date.now();
    let reply = '';
    while (Date.now() - started < 2_000) {
      const dialog = await openDialog(listener.port);
      await dialog.send('EHLO client.test');
      reply = await dialog.auth(created.token);
      dialog.close();
      if (reply.startsWith('535')) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(reply).toMatch(/^535 5\.7\.8 /);
  });

  it('stores nothing of a message whose token is revoked while its DATA is under way', async () => {
    const created = (await api('POST', '/tokens', { name: 'smtp mid-data', permissions: ['emails'] })).json();
    const dialog = await openDialog(listener.port);
    await dialog.send('EHLO client.test');
    expect(await dialog.auth(created.token)).toMatch(/^235 /);
    expect(await dialog.send('MAIL FROM:<app@acme.test>')).toMatch(/^250 /);
    expect(await dialog.send('RCPT TO:<mid-data@example.com>')).toMatch(/^250 /);
    expect(await dialog.send('DATA')).toMatch(/^354 /);
    dialog.write('From: app@acme.test\r\nTo: mid-data@example.com\r\nSubject: Revoked mid-data\r\n\r\nbody\r\n');
    expect((await ctx.app.inject({ method: 'DELETE', url: `/api/v2/tokens/${created.id}`, headers: bearer(token) })).statusCode).toBe(200);
    // Until another session's AUTH is refused: the revocation has reached the listener.
    await until(
      async () => {
        const probe = await openDialog(listener.port);
        await probe.send('EHLO client.test');
        const answer = await probe.auth(created.token);
        probe.close();
        return answer;
      },
      (answer) => answer.startsWith('535'),
    );
    dialog.write('.\r\n');
    expect(await dialog.reply()).toMatch(/^535 5\.7\.8 /);
    dialog.close();
    const stored = await ctx.services.orm.em.fork().execute(`select id from emails where subject = 'Revoked mid-data'`, [], 'all');
    expect(stored).toEqual([]);
  });
});

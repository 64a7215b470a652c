import { readFileSync } from 'node:fs';
import nodemailer from 'nodemailer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startInbound, startInboundServer, storeReports, type InboundMessage, type InboundServer, type InboundServerOptions } from '../src/inbound/server.js';
import { processReports } from '../src/shared/bounces/process.js';
import { insertReports, newReportId } from '../src/shared/bounces/queries.js';
import { newId } from '../src/shared/ids.js';
import { createRedis } from '../src/shared/redis.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { inboundProcessor } from '../src/workers/inbound.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { holdLock, preparedOnOneConnection } from './helpers/database.js';
import { openDialog } from './helpers/smtp-dialog.js';
import { selfSignedCertificate } from './helpers/tls.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';
import { until } from './helpers/until.js';

// Bounces and complaints by mail (docs/outcomes.md "Bounces and complaints by mail"): emails
// relayed through a real SMTP sink, then reports written the way real MTAs write them
// (test/fixtures/bounces/) delivered over real SMTP, with nodemailer's client, to the inbound listener.

const BOUNCE_DOMAIN = 'bounces.mailroom.test';

let sink: SmtpSink;
let ctx: TestContext;
let inbound: InboundServer;
let workers: RunningWorkers | undefined;
let connection: { disconnect(): void } | undefined;
let acme: { organizationId: string; token: string };
let other: { organizationId: string; token: string };

beforeAll(async () => {
  sink = await startSmtpSink();
  const tls = await selfSignedCertificate('inbound-tls');
  ctx = await createTestContext({
    MAIL_TRANSPORT: 'smtp',
    SMTP_URL: sink.url,
    BOUNCE_DOMAIN,
    INBOUND_MAX_MESSAGE_BYTES: String(2 * 1024 * 1024),
    INBOUND_TLS_KEY: tls.keyFile,
    INBOUND_TLS_CERT: tls.certFile,
  });
  acme = await createOrg(ctx.services, { name: 'Acme' });
  other = await createOrg(ctx.services, { name: 'Other' });
  // acme.test is a domain of Acme: its mail returns to bounces.acme.test. Other sends from a
  // domain it does not own: its mail returns to BOUNCE_DOMAIN.
  const domain = await ctx.app.inject({ method: 'POST', url: '/api/v2/domains', headers: bearer(acme.token), payload: { domain: 'acme.test' } });
  expect(domain.statusCode).toBeLessThan(300);
  const redis = createRedis(ctx.env.config.redisUrl, 'worker');
  connection = redis;
  workers = await startWorkers(ctx.services, redis, [emailSendProcessor('emails', { reconcileGraceMs: 0 }), inboundProcessor]);
  inbound = await startInbound(ctx.services, { port: 0 });
});
afterAll(async () => {
  await inbound?.close();
  await workers?.close();
  connection?.disconnect();
  await ctx?.close();
  await sink?.close();
});

const sql = <T = Record<string, unknown>>(query: string, params: unknown[] = []) => ctx.services.orm.em.fork().execute<T[]>(query, params, 'all');

/** A listener of its own, without TLS, that hands what it accepts to `accept` (by default drops it). */
function startBareServer(maxConnections: number, accept: InboundServerOptions['accept'] = async () => {}): Promise<InboundServer> {
  return startInboundServer({
    host: '127.0.0.1',
    port: 0,
    maxMessageBytes: 1024 * 1024,
    maxConnections,
    returnPaths: ctx.services.returnPaths,
    bounceDomain: ctx.services.config.inbound.bounceDomain,
    logger: ctx.services.logger,
    accept,
  });
}

async function getEmail(id: string, token = acme.token) {
  const response = await ctx.app.inject({ url: `/api/v2/emails/${id}`, headers: bearer(token) });
  expect(response.statusCode).toBe(200);
  return response.json() as { id: string; last_event: string; message_id?: string };
}

interface Sent {
  id: string;
  to: string;
  from: string;
  messageId: string;
  /** The envelope sender the relay saw. */
  returnPath: string;
}

/** Sends an email through the API and waits until the sink has it; returns its return path. */
async function send(to: string, org = acme, from = 'Acme News <news@acme.test>', copies: { cc?: string[]; bcc?: string[] } = {}): Promise<Sent> {
  const response = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: bearer(org.token), payload: { from, to, subject: 'Hello', html: '<p>Hi</p>', ...copies } });
  expect(response.statusCode).toBe(200);
  const id = response.json().id as string;
  const messageId = `${id}@${from.slice(from.indexOf('@') + 1).replace('>', '')}`;
  const index = await until(
    async () => sink.messages.findIndex((m) => m.messageId === `<${messageId}>`),
    (i) => i >= 0,
  );
  await until(() => getEmail(id, org.token), (e) => e.last_event === 'sent');
  return { id, to, from, messageId, returnPath: sink.senders[index]! };
}

function fixture(name: string, sent: Pick<Sent, 'to' | 'from' | 'messageId' | 'returnPath'>): string {
  const fromDomain = sent.from.slice(sent.from.indexOf('@') + 1).replace('>', '');
  return readFileSync(new URL(`./fixtures/bounces/${name}.eml`, import.meta.url), 'utf8')
    .replaceAll('{{RETURN_PATH}}', sent.returnPath)
    .replaceAll('{{RECIPIENT}}', sent.to)
    .replaceAll('{{MESSAGE_ID}}', sent.messageId)
    .replaceAll('{{FROM}}', sent.from)
    .replaceAll('{{FROM_DOMAIN}}', fromDomain)
    .replaceAll('{{SUBJECT}}', 'Hello')
    .replace(/\r?\n/g, '\r\n');
}

/** Delivers a report to the listener with nodemailer's SMTP client; envelope sender `<>` by default. */
async function deliver(raw: string | Buffer, to: string, from = '', port = inbound.port) {
  const client = nodemailer.createTransport({ host: '127.0.0.1', port, secure: false, ignoreTLS: true, connectionTimeout: 5_000 });
  try {
    return await client.sendMail({ envelope: { from, to: [to] }, raw });
  } finally {
    client.close();
  }
}

async function reportsOf(rcpt: string) {
  return sql<{ status: string; outcome: { verdict: { type: string; reason?: string; bounceType?: string }; event?: string; changed?: boolean } | null }>(
    `select status, outcome from inbound_reports where rcpt_to = ? order by id`,
    [rcpt],
  );
}

/** Waits until every report sent to `rcpt` is read; returns them. */
async function readReports(rcpt: string, count = 1) {
  return until(() => reportsOf(rcpt), (rows) => rows.length >= count && rows.every((r) => r.status !== 'received'));
}

async function suppressed(organizationId: string, address: string) {
  const rows = await sql(`select reason from suppressions where organization_id = ? and address = ?`, [organizationId, address]);
  return rows.length > 0;
}

describe('the return path (VERP)', () => {
  it('is a signed per-email address on the domain’s return-path host, or on BOUNCE_DOMAIN', async () => {
    const own = await send('verp-own@example.com');
    const unowned = await send('verp-unowned@example.com', other, 'Other <hello@other.test>');
    expect(own.returnPath).toMatch(/^b\+[0-9a-z]{42}@bounces\.acme\.test$/);
    expect(unowned.returnPath).toMatch(new RegExp(`^b\\+[0-9a-z]{42}@${BOUNCE_DOMAIN.replaceAll('.', '\\.')}$`));
    expect(own.returnPath.split('@')[0]!.length).toBeLessThanOrEqual(64);
    // Per email: two emails never share one.
    const again = await send('verp-own2@example.com');
    expect(again.returnPath).not.toBe(own.returnPath);
    expect(ctx.services.returnPaths.verify(own.returnPath)?.emailId).toBe(own.id);
  });
});

describe('bounces by mail', () => {
  it('a DSN whose diagnostic holds a NUL (a remote server wrote it) is applied, the NUL stored as U+FFFD', async () => {
    const sent = await send('nul-diagnostic@example.com');
    await deliver(fixture('postfix-dsn', sent).replace('Diagnostic-Code: smtp; 550 5.1.1', 'Diagnostic-Code: smtp; 550 5.1.1 a\u0000b'), sent.returnPath);
    await until(() => getEmail(sent.id), (e) => e.last_event === 'bounced');
    const [event] = await sql<{ details: { diagnostic: string } }>(`select details from email_events where email_id = ? and type = 'bounced'`, [sent.id]);
    expect(event!.details.diagnostic).toContain('a\ufffdb');
  });

  it('a Postfix DSN makes the email bounced, and the next send to the address fails without reaching the relay', async () => {
    const sent = await send('gone@example.com');
    await deliver(fixture('postfix-dsn', sent), sent.returnPath);
    const [report] = await readReports(sent.returnPath);
    expect(report!.outcome).toMatchObject({ verdict: { type: 'bounced', bounceType: 'hard' }, event: 'email.bounced', changed: true });
    expect((await getEmail(sent.id)).last_event).toBe('bounced');
    expect(await suppressed(acme.organizationId, 'gone@example.com')).toBe(true);
    const [history] = await sql<{ hard_bounced_at: Date | null; mailbox_not_found_at: Date | null }>(
      `select hard_bounced_at, mailbox_not_found_at from verification_history where email = ?`,
      ['gone@example.com'],
    );
    expect(history?.hard_bounced_at).toBeTruthy();

    const before = sink.accepted;
    const response = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails', headers: bearer(acme.token), payload: { from: 'news@acme.test', to: 'gone@example.com', subject: 'Again', html: '<p>x</p>' } });
    expect(response.statusCode).toBe(200);
    const next = await until(() => getEmail(response.json().id), (e) => e.last_event === 'failed');
    expect(next.last_event).toBe('failed');
    // Sent after the suppressed one: when it has arrived, the suppressed one would have too.
    await send('still-live@example.com');
    expect(sink.messages.some((m) => m.subject === 'Again')).toBe(false);
    expect(sink.accepted).toBe(before + 1);
  });

  it('an Exim DSN is a hard bounce, its delay warning a delivery_delayed with no bounce', async () => {
    const sent = await send('exim-user@example.com');
    await deliver(fixture('exim-delayed', sent), sent.returnPath);
    const [delayed] = await readReports(sent.returnPath);
    expect(delayed!.outcome).toMatchObject({ status: 'applied', verdict: { type: 'delayed' }, event: 'email.delivery_delayed' });
    expect((await getEmail(sent.id)).last_event).toBe('sent');
    expect(await suppressed(acme.organizationId, 'exim-user@example.com')).toBe(false);
    const delays = await sql(`select details from email_events where email_id = ? and type = 'delivery_delayed'`, [sent.id]);
    expect(delays).toHaveLength(1);

    await deliver(fixture('exim-dsn', sent), sent.returnPath);
    const rows = await readReports(sent.returnPath, 2);
    expect(rows[1]!.outcome).toMatchObject({ verdict: { type: 'bounced', bounceType: 'hard' } });
    expect((await getEmail(sent.id)).last_event).toBe('bounced');
    expect(await suppressed(acme.organizationId, 'exim-user@example.com')).toBe(true);
  });

  it('a Gmail-style unstructured bounce with 550 5.1.1 is hard; one without a 5.x.x status is soft', async () => {
    const hard = await send('nobody@gmail-example.com');
    await deliver(fixture('gmail-unstructured', hard), hard.returnPath);
    const [report] = await readReports(hard.returnPath);
    expect(report!.outcome).toMatchObject({ verdict: { type: 'bounced', bounceType: 'hard' } });
    expect(await suppressed(acme.organizationId, 'nobody@gmail-example.com')).toBe(true);

    const soft = await send('full@gmail-example.com');
    const text = fixture('gmail-unstructured', soft)
      .replace(/550 5\.1\.1 The email account that you tried to reach does not exist\./g, '452 4.2.2 The recipient\'s inbox is out of storage space.')
      .replace(/\*\* Address not found \*\*/, '** Message not delivered **');
    expect(text).not.toMatch(/\b5\.\d\.\d\b|\b550\b/);
    await deliver(text, soft.returnPath);
    const [softReport] = await readReports(soft.returnPath);
    expect(softReport!.outcome).toMatchObject({ verdict: { type: 'bounced', bounceType: 'soft' } });
    expect((await getEmail(soft.id)).last_event).toBe('bounced');
    expect(await suppressed(acme.organizationId, 'full@gmail-example.com')).toBe(false);
  });

  it('the same report twice has one effect', async () => {
    const sent = await send('twice@example.com');
    const raw = fixture('postfix-dsn', sent);
    await deliver(raw, sent.returnPath);
    await deliver(raw, sent.returnPath);
    const rows = await readReports(sent.returnPath, 2);
    expect(rows.map((r) => r.outcome?.changed).sort()).toEqual([false, true]);
    const [events] = await sql<{ n: number }>(`select count(*)::int as n from email_events where email_id = ?`, [sent.id]);
    expect(events!.n).toBe(1);
    const [suppressions] = await sql<{ n: number }>(`select count(*)::int as n from suppressions where address = ?`, ['twice@example.com']);
    expect(suppressions!.n).toBe(1);
  });

  it('a report read by several jobs at once is applied by one of them', async () => {
    const sent = await send('racing@example.com');
    // Stored without a job (the reconciler waits a minute): only the runs below read it.
    const report = { id: newReportId(), emailId: sent.id, mailFrom: '', rcptTo: sent.returnPath, raw: Buffer.from(fixture('postfix-dsn', sent)) };
    await insertReports(ctx.services.orm.em, [report], new Date());
    const runs = await Promise.all([1, 2, 3].map(() => processReports(ctx.services.orm.em.fork(), [report.id], { bounceDomain: BOUNCE_DOMAIN, now: new Date() })));
    expect(runs.filter((outcomes) => outcomes.has(report.id))).toHaveLength(1);
    expect((await reportsOf(sent.returnPath)).map((r) => r.status)).toEqual(['applied']);
    const [events] = await sql<{ n: number }>(`select count(*)::int as n from email_events where email_id = ?`, [sent.id]);
    expect(events!.n).toBe(1);
  });

  it("prepares a job's statements once on their connection", async () => {
    const sent = await send('prepared@example.com');
    const report = { id: newReportId(), emailId: sent.id, mailFrom: '', rcptTo: sent.returnPath, raw: Buffer.from(fixture('postfix-dsn', sent)) };
    await insertReports(ctx.services.orm.em, [report], new Date());
    const prepared = await preparedOnOneConnection(ctx.env.config.databaseUrl, async (orm) => {
      const outcomes = await processReports(orm.em.fork(), [report.id], { bounceDomain: BOUNCE_DOMAIN, now: new Date() });
      expect(outcomes.get(report.id)).toMatchObject({ status: 'applied', event: 'email.bounced' });
    });
    expect(prepared).toEqual(
      expect.arrayContaining([
        'mailroom_inbound_pending',
        'mailroom_inbound_emails',
        'mailroom_inbound_claim',
        'mailroom_feedback_lock_emails',
        'mailroom_feedback_events',
        'mailroom_feedback_statuses',
        'mailroom_feedback_suppressions',
        'mailroom_feedback_history',
        'mailroom_outbox_emails',
        'mailroom_inbound_finish',
      ]),
    );
  });
});

describe('one message to one return path under several hosts', () => {
  it('is stored as one report', async () => {
    const sent = await send('hosts@example.com');
    const local = sent.returnPath.split('@')[0]!;
    const client = nodemailer.createTransport({ host: '127.0.0.1', port: inbound.port, secure: false, ignoreTLS: true, connectionTimeout: 5_000 });
    try {
      await client.sendMail({ envelope: { from: '', to: [sent.returnPath, `${local}@a.example`, `${local}@b.example`] }, raw: fixture('postfix-dsn', sent) });
    } finally {
      client.close();
    }
    await readReports(sent.returnPath);
    const [stored] = await sql<{ n: number }>(`select count(*)::int as n from inbound_reports where email_id = ?`, [sent.id]);
    expect(stored!.n).toBe(1);
  });
});

describe('complaints by mail (ARF)', () => {
  for (const [name, address] of [
    ['yahoo-arf', 'reader@yahoo-example.com'],
    ['microsoft-arf', 'reader@hotmail-example.com'],
  ] as const) {
    it(`a ${name.split('-')[0]} feedback report makes the email complained and the subscriber COMPLAINED`, async () => {
      const created = await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(acme.token), payload: { email: address } });
      expect(created.statusCode).toBeLessThan(300);
      const sent = await send(address);
      await deliver(fixture(name, sent), sent.returnPath, 'feedback@reports.example');
      const [report] = await readReports(sent.returnPath);
      expect(report!.outcome).toMatchObject({ verdict: { type: 'complained' }, event: 'email.complained' });
      expect((await getEmail(sent.id)).last_event).toBe('complained');
      expect(await suppressed(acme.organizationId, address)).toBe(true);
      const [subscriber] = await sql<{ status: string }>(`select status from subscribers where organization_id = ? and email = ?`, [acme.organizationId, address]);
      expect(subscriber!.status).toBe('COMPLAINED');
    });
  }
});

describe('bad input is refused or ignored without effect, and the listener keeps serving', () => {
  async function refused(promise: Promise<unknown>): Promise<number | undefined> {
    try {
      await promise;
    } catch (error) {
      return (error as { responseCode?: number }).responseCode;
    }
    throw new Error('the listener accepted it');
  }
  const storedCount = async () => (await sql<{ n: number }>(`select count(*)::int as n from inbound_reports`))[0]!.n;

  it('refuses at RCPT an address that is not a return path, and a forged token (550)', async () => {
    const sent = await send('forged@example.com');
    const before = await storedCount();
    expect(await refused(deliver(fixture('postfix-dsn', sent), 'postmaster@bounces.acme.test'))).toBe(550);
    // The right shape, the MAC of another key.
    const local = sent.returnPath.split('@')[0]!;
    const forged = `${local.slice(0, -16)}${local.slice(-16).split('').reverse().join('')}@bounces.acme.test`;
    expect(await refused(deliver(fixture('postfix-dsn', sent), forged))).toBe(550);
    // Another email's id with this email's MAC.
    const swapped = `b+${(await send('forged2@example.com')).returnPath.slice(2, 28)}${local.slice(-16)}@bounces.acme.test`;
    expect(await refused(deliver(fixture('postfix-dsn', sent), swapped))).toBe(550);
    // A valid token at a host that is no return-path host (neither `bounces.…` nor BOUNCE_DOMAIN).
    for (const host of ['gmail.com', 'localhost', 'acme.test']) expect(await refused(deliver(fixture('postfix-dsn', sent), `${local}@${host}`)), host).toBe(550);
    expect(await storedCount()).toBe(before);
    expect((await getEmail(sent.id)).last_event).toBe('sent');
  });

  it('refuses a 20 MB report (552) and stores nothing', async () => {
    const sent = await send('huge@example.com');
    const before = await storedCount();
    const raw = Buffer.concat([Buffer.from(fixture('postfix-dsn', sent).replace(/--7D1C21A0B3[^\r]*--\r\n$/, '')), Buffer.alloc(20 * 1024 * 1024, 'A')]);
    expect(await refused(deliver(raw, sent.returnPath))).toBe(552);
    expect(await storedCount()).toBe(before);
    expect((await getEmail(sent.id)).last_event).toBe('sent');
  });

  it('refuses a declared SIZE= over the limit at MAIL (552 5.3.4), and recipients past 10 (452 4.5.3)', async () => {
    // docs/outcomes.md "Bounces and complaints by mail": the listener's replies.
    // Valid return paths (the listener checks their MAC only); the same address twice is one recipient.
    const returnPaths = Array.from({ length: 11 }, () => ctx.services.returnPaths.address(newId('eml'), 'bounces.acme.test'));
    const dialog = await openDialog(inbound.port);
    try {
      expect(await dialog.send('EHLO mta.example.net')).toMatch(/^250/);
      expect(await dialog.send(`MAIL FROM:<> SIZE=${2 * 1024 * 1024 + 1}`)).toMatch(/^552 5\.3\.4 /);
      expect(await dialog.send(`MAIL FROM:<> SIZE=${2 * 1024 * 1024}`)).toMatch(/^250 /);
      for (const address of returnPaths.slice(0, 10)) expect(await dialog.send(`RCPT TO:<${address}>`)).toMatch(/^250 /);
      expect(await dialog.send(`RCPT TO:<${returnPaths[10]}>`)).toMatch(/^452 4\.5\.3 /);
    } finally {
      dialog.close();
    }
  });

  it('turns away a connection past INBOUND_MAX_CONNECTIONS (421), and serves again once one closes', async () => {
    const small = await startBareServer(1);
    const first = await openDialog(small.port);
    try {
      expect(first.greeting).toMatch(/^220 /);
      const second = await openDialog(small.port);
      expect(second.greeting).toMatch(/^421 /);
      second.close();
      first.close();
      await first.closed;
      const third = await until(
        () => openDialog(small.port),
        (dialog) => {
          if (dialog.greeting.startsWith('220')) return true;
          dialog.close();
          return false;
        },
      );
      third.close();
    } finally {
      first.close();
      await small.close();
    }
  });

  it('answers 451 4.3.0 when the report cannot be stored, and 250 to the retry once it can', async () => {
    // docs/outcomes.md "Bounces and complaints by mail": PostgreSQL unavailable while storing.
    let storing: 'down' | 'up' = 'down';
    const stored: string[] = [];
    const flaky = await startBareServer(5, async (message) => {
      if (storing === 'down') throw new Error('connection refused');
      stored.push(...message.recipients.map((r) => r.emailId));
    });
    const emailId = newId('eml');
    const dialog = await openDialog(flaky.port);
    try {
      expect(await dialog.send('EHLO mta.example.net')).toMatch(/^250/);
      const transaction = async () => {
        expect(await dialog.send('MAIL FROM:<>')).toMatch(/^250 /);
        expect(await dialog.send(`RCPT TO:<${ctx.services.returnPaths.address(emailId, 'bounces.acme.test')}>`)).toMatch(/^250 /);
        expect(await dialog.send('DATA')).toMatch(/^354 /);
        return dialog.send('Subject: Undelivered Mail\r\n\r\nNo such user.\r\n.');
      };
      expect(await transaction()).toMatch(/^451 4\.3\.0 /);
      expect(stored).toEqual([]);
      storing = 'up';
      expect(await transaction()).toMatch(/^250 /);
      expect(stored).toEqual([emailId]);
    } finally {
      dialog.close();
      await flaky.close();
    }
  });

  it('answers 250 only once the report is committed; 451 4.3.0 when PostgreSQL refuses it, then 250 to the retry', async () => {
    const dialog = await openDialog(inbound.port);
    const transaction = async (rcpt: string) => {
      expect(await dialog.send('MAIL FROM:<>')).toMatch(/^250 /);
      expect(await dialog.send(`RCPT TO:<${rcpt}>`)).toMatch(/^250 /);
      expect(await dialog.send('DATA')).toMatch(/^354 /);
      return dialog.send('Subject: Undelivered Mail\r\n\r\nNo such user.\r\n.');
    };
    const stored = async (emailId: string) => ((await sql<{ n: number }>('select count(*)::int as n from inbound_reports where email_id = ?', [emailId]))[0]!.n);
    try {
      expect(await dialog.send('EHLO mta.example.net')).toMatch(/^250/);
      // Another session holds the table: the insert waits, and so does the answer.
      const waiting = newId('eml');
      const lock = await holdLock(ctx.services.orm.em, 'lock table inbound_reports in exclusive mode');
      const answer = transaction(ctx.services.returnPaths.address(waiting, 'bounces.acme.test'));
      try {
        expect(await Promise.race([answer, new Promise((r) => setTimeout(() => r('no answer yet'), 500))])).toBe('no answer yet');
      } finally {
        await lock.release();
      }
      expect(await answer).toMatch(/^250 /);
      expect(await stored(waiting)).toBe(1);

      // PostgreSQL refuses the row (a constraint on this host only): 451, nothing stored.
      const refusedOnce = newId('eml');
      await sql(`alter table inbound_reports add constraint refuse_probe check (rcpt_to not like '%@bounces.refuse.example') not valid`);
      try {
        expect(await transaction(ctx.services.returnPaths.address(refusedOnce, 'bounces.refuse.example'))).toMatch(/^451 4\.3\.0 /);
        expect(await stored(refusedOnce)).toBe(0);
      } finally {
        await sql('alter table inbound_reports drop constraint refuse_probe');
      }
      expect(await transaction(ctx.services.returnPaths.address(refusedOnce, 'bounces.refuse.example'))).toMatch(/^250 /);
      expect(await stored(refusedOnce)).toBe(1);
    } finally {
      dialog.close();
    }
  });

  it('ignores a malformed MIME report', async () => {
    const sent = await send('malformed@example.com');
    const raw = [
      `From: MAILER-DAEMON@mx1.relay-example.net`,
      `To: ${sent.returnPath}`,
      `Subject: Undelivered Mail Returned to Sender`,
      `Content-Type: multipart/report; report-type=delivery-status; boundary="never-closed"`,
      '',
      '--never-closed',
      'Content-Type: message/delivery-status',
      'Content-Transfer-Encoding: base64',
      '',
      '%%%% not base64, no fields %%%%',
      '--never-closed',
      'Content-Type: text/rfc822-headers',
      '',
      `Message-ID: <${sent.messageId}>`,
    ].join('\r\n');
    await deliver(raw, sent.returnPath, 'mailer-daemon@mx1.relay-example.net');
    const [report] = await readReports(sent.returnPath);
    expect(report!.status).toBe('ignored');
    expect((await getEmail(sent.id)).last_event).toBe('sent');
    expect(await suppressed(acme.organizationId, 'malformed@example.com')).toBe(false);
  });

  it('applies a report to the email its Message-ID names when that email is of the return path’s organization', async () => {
    // docs/outcomes.md: a feedback loop registered with one return path reports another message.
    const reported = await send('looped@example.com');
    const registered = await send('registered@example.com');
    await deliver(fixture('postfix-dsn', { ...reported, returnPath: registered.returnPath }), registered.returnPath);
    const [report] = await readReports(registered.returnPath);
    expect(report!.status).toBe('applied');
    expect((await getEmail(reported.id)).last_event).toBe('bounced');
    expect((await getEmail(registered.id)).last_event).toBe('sent');
    expect(await suppressed(acme.organizationId, 'looped@example.com')).toBe(true);
    expect(await suppressed(acme.organizationId, 'registered@example.com')).toBe(false);
  });

  it('ignores a report about another organization’s email', async () => {
    const victim = await send('victim@example.com', other, 'Other <hello@other.test>');
    const attacker = await send('attacker@example.com');
    // Acme's own return path, Other's Message-ID and recipient in the returned headers.
    await deliver(fixture('postfix-dsn', { ...victim, returnPath: attacker.returnPath }), attacker.returnPath);
    // Other's return path at Acme's return-path host.
    const moved = `${victim.returnPath.split('@')[0]}@bounces.acme.test`;
    await deliver(fixture('postfix-dsn', { ...victim, returnPath: moved }), moved);
    const [first] = await readReports(attacker.returnPath);
    const [second] = await readReports(moved);
    expect(first!.status).toBe('ignored');
    expect(second!.status).toBe('ignored');
    expect((await getEmail(victim.id, other.token)).last_event).toBe('sent');
    expect((await getEmail(attacker.id)).last_event).toBe('sent');
    expect(await suppressed(other.organizationId, 'victim@example.com')).toBe(false);
    expect(await suppressed(acme.organizationId, 'victim@example.com')).toBe(false);
  });

  it('ignores a bounce of a bounce (a DSN whose returned message is itself a DSN)', async () => {
    const sent = await send('loop@example.com');
    const inner = fixture('postfix-dsn', sent);
    const loop = fixture('exim-dsn', sent).replace(
      /Content-type: message\/rfc822\r\n\r\n[\s\S]*?\r\n--1795500801-eximdsn-1325785123--/,
      `Content-type: message/rfc822\r\n\r\nReturn-Path: <>\r\n${inner}\r\n--1795500801-eximdsn-1325785123--`,
    );
    expect(loop).toContain('Undelivered Mail Returned to Sender');
    await deliver(loop, sent.returnPath);
    const [report] = await readReports(sent.returnPath);
    expect(report!.outcome).toMatchObject({ status: 'ignored', verdict: { type: 'ignored' } });
    expect((await getEmail(sent.id)).last_event).toBe('sent');
    expect(await suppressed(acme.organizationId, 'loop@example.com')).toBe(false);
  });

  it('still serves after all of that', async () => {
    const sent = await send('after@example.com');
    await deliver(fixture('postfix-dsn', sent), sent.returnPath);
    await readReports(sent.returnPath);
    expect((await getEmail(sent.id)).last_event).toBe('bounced');
  });
});

describe('STARTTLS', () => {
  it('is offered with INBOUND_TLS_KEY and INBOUND_TLS_CERT: a client requiring TLS delivers a DSN over it', async () => {
    const sent = await send('tls-user@example.com');
    // requireTLS: the client fails unless STARTTLS is offered and succeeds.
    const client = nodemailer.createTransport({ host: '127.0.0.1', port: inbound.port, secure: false, requireTLS: true, tls: { rejectUnauthorized: false }, connectionTimeout: 5_000 });
    try {
      const info = await client.sendMail({ envelope: { from: '', to: [sent.returnPath] }, raw: fixture('postfix-dsn', sent) });
      expect(info.accepted).toEqual([sent.returnPath]);
    } finally {
      client.close();
    }
    const [report] = await readReports(sent.returnPath);
    expect(report!.outcome).toMatchObject({ verdict: { type: 'bounced', bounceType: 'hard' } });
    expect((await getEmail(sent.id)).last_event).toBe('bounced');
  });

  it('is not offered without a certificate: a client requiring TLS is turned away', async () => {
    const plain = await startBareServer(5);
    try {
      const sent = await send('no-tls@example.com');
      const client = nodemailer.createTransport({ host: '127.0.0.1', port: plain.port, secure: false, requireTLS: true, connectionTimeout: 5_000 });
      await expect(client.sendMail({ envelope: { from: '', to: [sent.returnPath] }, raw: fixture('postfix-dsn', sent) })).rejects.toThrow(/STARTTLS/i);
      client.close();
      // The same listener serves a client that does not ask for TLS.
      await deliver(fixture('postfix-dsn', sent), sent.returnPath, '', plain.port);
    } finally {
      await plain.close();
    }
  });
});

describe('copy recipients (cc, bcc)', () => {
  it('a DSN for a cc recipient suppresses that address and records its event; the email’s status follows its `to`', async () => {
    const sent = await send('main-reader@example.com', acme, 'Acme News <news@acme.test>', { cc: ['Copy Reader <Copy-Reader@example.com>'], bcc: ['hidden-reader@example.com'] });
    await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(acme.token), payload: { email: 'copy-reader@example.com' } });

    await deliver(fixture('postfix-dsn', { ...sent, to: 'copy-reader@example.com' }), sent.returnPath);
    const [copy] = await readReports(sent.returnPath);
    expect(copy!.outcome).toMatchObject({ status: 'applied', verdict: { type: 'bounced', bounceType: 'hard', copy: 'copy-reader@example.com' } });
    expect((await getEmail(sent.id)).last_event).toBe('sent');
    expect(await suppressed(acme.organizationId, 'copy-reader@example.com')).toBe(true);
    expect(await suppressed(acme.organizationId, 'main-reader@example.com')).toBe(false);
    const [subscriber] = await sql<{ status: string }>(`select status from subscribers where organization_id = ? and email = ?`, [acme.organizationId, 'copy-reader@example.com']);
    expect(subscriber!.status).toBe('BOUNCED');
    const [history] = await sql<{ hard_bounced_at: Date | null }>(`select hard_bounced_at from verification_history where email = ?`, ['copy-reader@example.com']);
    expect(history?.hard_bounced_at).toBeTruthy();

    // An ARF report about the bcc recipient: a complaint about that address.
    await deliver(fixture('yahoo-arf', { ...sent, to: 'hidden-reader@example.com' }), sent.returnPath, 'feedback@reports.example');
    const rows = await readReports(sent.returnPath, 2);
    expect(rows[1]!.outcome).toMatchObject({ verdict: { type: 'complained', copy: 'hidden-reader@example.com' } });
    expect(await suppressed(acme.organizationId, 'hidden-reader@example.com')).toBe(true);
    expect((await getEmail(sent.id)).last_event).toBe('sent');

    // Then the `to` bounces: its own event, and the email reads bounced.
    await deliver(fixture('postfix-dsn', sent), sent.returnPath);
    const all = await readReports(sent.returnPath, 3);
    expect(all[2]!.outcome).toMatchObject({ verdict: { type: 'bounced' }, changed: true });
    expect(all[2]!.outcome).not.toHaveProperty('verdict.copy');
    expect((await getEmail(sent.id)).last_event).toBe('bounced');
    expect(await suppressed(acme.organizationId, 'main-reader@example.com')).toBe(true);
    const events = await sql<{ type: string; recipient: string | null }>(
      `select type, details ->> 'recipient' as recipient from email_events where email_id = ? order by coalesce(details ->> 'recipient', '~')`,
      [sent.id],
    );
    expect(events).toEqual([
      { type: 'bounced', recipient: 'copy-reader@example.com' },
      { type: 'complained', recipient: 'hidden-reader@example.com' },
      { type: 'bounced', recipient: null },
    ]);
  });

  it('a DSN of an email with copies that names none of its recipients is ignored', async () => {
    const sent = await send('main2@example.com', acme, 'Acme News <news@acme.test>', { cc: ['cc2@example.com'] });
    await deliver(fixture('postfix-dsn', { ...sent, to: 'stranger@example.com' }), sent.returnPath);
    const [report] = await readReports(sent.returnPath);
    expect(report!.status).toBe('ignored');
    expect(await suppressed(acme.organizationId, 'stranger@example.com')).toBe(false);
    expect(await suppressed(acme.organizationId, 'cc2@example.com')).toBe(false);
  });
});

describe('the inbound reports metric', () => {
  async function counts(): Promise<Record<string, number>> {
    const response = await ctx.app.inject({ url: '/metrics' });
    expect(response.statusCode).toBe(200);
    const out: Record<string, number> = { applied: 0, duplicate: 0, unmatched: 0, refused: 0 };
    for (const match of response.body.matchAll(/^mailroom_inbound_reports_total\{outcome="(\w+)"\} (\d+)/gm)) out[match[1]!] = Number(match[2]);
    return out;
  }

  it('counts real reports by outcome: applied, duplicate, unmatched, refused', async () => {
    const before = await counts();
    const sent = await send('metric@example.com');
    const raw = fixture('postfix-dsn', sent);
    await deliver(raw, sent.returnPath);
    await readReports(sent.returnPath);
    await deliver(raw, sent.returnPath);
    await readReports(sent.returnPath, 2);
    // A valid token on another organization's return-path host: no email of that host.
    const victim = await send('metric-victim@example.com', other, 'Other <hello@other.test>');
    const moved = `${victim.returnPath.split('@')[0]}@bounces.acme.test`;
    await deliver(fixture('postfix-dsn', { ...victim, returnPath: moved }), moved);
    await readReports(moved);
    // Refused at RCPT (not a return path), and read but not a report (no mailer-daemon).
    await expect(deliver(raw, 'postmaster@bounces.acme.test')).rejects.toMatchObject({ responseCode: 550 });
    const personal = await send('metric-person@example.com');
    await deliver(`From: someone@example.com\r\nTo: ${personal.returnPath}\r\nSubject: Re: Hello\r\n\r\nThanks!\r\n`, personal.returnPath, 'someone@example.com');
    await readReports(personal.returnPath);

    const after = await counts();
    expect(after.applied! - before.applied!).toBe(1);
    expect(after.duplicate! - before.duplicate!).toBe(1);
    expect(after.unmatched! - before.unmatched!).toBe(1);
    expect(after.refused! - before.refused!).toBe(2);
  });
});

describe('the reconciler of reports whose job was lost', () => {
  it('enqueues an unread report again on every run, not only while no job of its id was kept', async () => {
    // A report stored two minutes ago and never enqueued (Redis lost it, or its job failed).
    const id = newReportId();
    const now = Date.now();
    await insertReports(ctx.services.orm.em, [{ id, emailId: newId('eml'), mailFrom: '', rcptTo: 'b+x@bounces.acme.test', raw: Buffer.from('x') }], new Date(now - 120_000));
    const reconcile = inboundProcessor.handlers.reconcile;
    // Two runs a minute apart. A failed job is kept for days (removeOnFail): if the second run's
    // job had the first's id, its add would be a no-op and the report would stay unread.
    const jobIdsAt = async (at: number) => {
      const jobIds: string[] = [];
      const producer = { add: async (_queue: string, job: { data: { reportIds: string[] }; jobId?: string }) => void (job.data.reportIds.includes(id) && jobIds.push(job.jobId!)) };
      const services = Object.assign(Object.create(ctx.services) as typeof ctx.services, { producer, clock: () => new Date(at) });
      await reconcile({}, { services, em: ctx.services.orm.em.fork(), log: ctx.services.logger, job: {} } as never);
      return jobIds;
    };
    const first = await jobIdsAt(now);
    const second = await jobIdsAt(now + 60_000);
    expect(first).toHaveLength(1);
    expect(second).toHaveLength(1);
    expect(second[0]).not.toBe(first[0]);
  });
});

describe('storing reports', () => {
  it('writes a group of reports in one statement, each raw report byte for byte, beyond the prepared sizes too', async () => {
    const em = ctx.services.orm.em.fork();
    for (const size of [1, 3, 8, 9, 40]) {
      // Every byte value, and a size per report: binary parameters must not be re-encoded.
      const reports = Array.from({ length: size }, (_, i) => ({
        id: newReportId(),
        emailId: newId('eml'),
        mailFrom: i % 2 ? '' : 'MAILER-DAEMON@mx.example.com',
        rcptTo: `b+${i}@bounces.acme.test`,
        raw: Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, b) => b)), Buffer.alloc(i * 37, i)]),
      }));
      await insertReports(em, reports, new Date('2026-11-20T10:00:00Z'));
      const rows = await em.execute<{ id: string; mail_from: string; rcpt_to: string; size: number; raw: Buffer; received_at: Date }[]>(
        `select id, mail_from, rcpt_to, size, raw, received_at from inbound_reports where id in (?) order by id`,
        [reports.map((r) => r.id)],
        'all',
      );
      expect(rows.map((r) => r.id)).toEqual(reports.map((r) => r.id));
      rows.forEach((row, i) => {
        expect(row.raw.equals(reports[i]!.raw)).toBe(true);
        expect(row.size).toBe(reports[i]!.raw.length);
        expect(row.mail_from).toBe(reports[i]!.mailFrom);
        expect(row.rcpt_to).toBe(reports[i]!.rcptTo);
        expect(new Date(row.received_at).toISOString()).toBe('2026-11-20T10:00:00.000Z');
      });
    }
  });
});

describe('the group commit of the listener', () => {
  it('counts the other sessions with a message under way: MAIL accepted, the message not handed over, the session not reset or closed', async () => {
    const seen: number[] = [];
    let underWay: (() => number) | undefined;
    const server = await startBareServer(10, async (_message, count) => {
      seen.push(count());
      underWay = count;
    });
    const returnPath = (await send('under-way@example.com')).returnPath;
    const open = async (steps: string[]) => {
      const dialog = await openDialog(server.port);
      for (const step of steps) expect(await dialog.send(step)).toMatch(/^(250|354)/);
      return dialog;
    };
    try {
      const idle = await open(['EHLO client.test']);
      const pending = await open(['EHLO client.test', 'MAIL FROM:<>', `RCPT TO:<${returnPath}>`]);
      const started = await open(['EHLO client.test', 'MAIL FROM:<>']);
      const reset = await open(['EHLO client.test', 'MAIL FROM:<>', 'RSET']);
      const sender = await open(['EHLO client.test', 'MAIL FROM:<>', `RCPT TO:<${returnPath}>`, 'DATA']);
      expect(await sender.send('Subject: a report\r\n\r\nbody\r\n.')).toMatch(/^250/);
      // The sender's own message is handed over; `pending` and `started` are under way.
      expect(seen).toEqual([2]);
      started.close();
      await started.closed;
      await until(async () => underWay!(), (n) => n === 1);
      // A session whose message is handed over counts no more.
      pending.write('DATA\r\n');
      expect(await pending.reply()).toMatch(/^354/);
      expect(await pending.send('Subject: another\r\n\r\nbody\r\n.')).toMatch(/^250/);
      expect(seen).toEqual([2, 0]);
      for (const dialog of [idle, pending, reset, sender]) dialog.close();
    } finally {
      await server.close();
    }
  });

  it('commits the messages under way on other sessions with the one that waits for them, and waits for a stalled one no longer than a moment', async () => {
    const store = storeReports(ctx.services);
    const message = (i: number): InboundMessage => ({ mailFrom: '', recipients: [{ address: `b+group${i}@bounces.acme.test`, emailId: newId('eml') }], raw: Buffer.from(`report ${i}\r\n`) });
    // Rows written by one statement share their inserting transaction (xmin) until the worker
    // reads them, which their job (enqueued 100 ms after the commit at the earliest) holds off.
    const transactions = async (from: number, to: number) =>
      (await sql<{ xmin: string }>(`select xmin::text as xmin from inbound_reports where rcpt_to in (select 'b+group' || g || '@bounces.acme.test' from generate_series(?::int, ?::int) g)`, [from, to])).map((r) => r.xmin);
    try {
      // Three sessions hand their messages over in one turn; the first finds two under way.
      let underWay = 2;
      const first = store.accept(message(1), () => underWay);
      underWay = 1;
      const second = store.accept(message(2), () => underWay);
      underWay = 0;
      const third = store.accept(message(3), () => underWay);
      await Promise.all([first, second, third]);
      const grouped = await transactions(1, 3);
      expect(grouped).toHaveLength(3);
      expect(new Set(grouped).size).toBe(1);

      // A session that never hands its message over does not hold the others' answers.
      const started = performance.now();
      await store.accept(message(4), () => 1);
      expect(performance.now() - started).toBeLessThan(1_000);
      expect(await transactions(4, 4)).toHaveLength(1);
    } finally {
      await store.close();
    }
  });
});

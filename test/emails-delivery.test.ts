import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { simpleParser } from 'mailparser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DeliveryStore, deliverEmail, UNCERTAIN_REASON } from '../src/shared/emails/deliver.js';
import type { MailTransport } from '../src/shared/emails/transport.js';
import { createRedis } from '../src/shared/redis.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { startWorkers, type RunningWorkers } from '../src/workers/runner.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { preparedOnOneConnection } from './helpers/database.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';
import { until } from './helpers/until.js';

let sink: SmtpSink;
let ctx: TestContext;
let token: string;
let workers: RunningWorkers | undefined;
const connections: { disconnect(): void }[] = [];

async function startEmailWorkers(c: TestContext): Promise<RunningWorkers> {
  const connection = createRedis(c.env.config.redisUrl, 'worker');
  connections.push(connection);
  return startWorkers(c.services, connection, [emailSendProcessor('emails', { reconcileGraceMs: 0 })]);
}

beforeAll(async () => {
  sink = await startSmtpSink();
  ctx = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url });
  const org = await createOrg(ctx.services);
  token = org.token;
  // Open/click tracking is tested in outcomes.test.ts; here what is sent is what is stored.
  await ctx.services.orm.em.fork().execute('update organizations set track_opens = false, track_clicks = false where id = ?', [org.organizationId]);
});
afterAll(async () => {
  await workers?.close();
  for (const c of connections) c.disconnect();
  await ctx?.close();
  await sink?.close();
});

function send(body: object, c = ctx, as = token) {
  return c.app.inject({ method: 'POST', url: '/api/v2/emails', headers: bearer(as), payload: body });
}

async function getEmail(id: string, c = ctx, as = token) {
  return (await c.app.inject({ url: `/api/v2/emails/${id}`, headers: bearer(as) })).json();
}

const received = (messageId: string) => sink.messages.filter((m) => m.messageId === `<${messageId}>`);

describe('delivery over SMTP', () => {
  beforeAll(async () => {
    workers = await startEmailWorkers(ctx);
  });

  it('renders markdown, sends it and records sent with the Message-ID', async () => {
    const id = (
      await send({
        from: 'Acme Support <support@acme.test>',
        to: ['jane@example.com'],
        cc: 'boss@example.com',
        reply_to: 'help@acme.test',
        subject: 'Welcome, Jane',
        markdown: '# Hello Jane\n\n| plan | price |\n|---|---|\n| pro | 10 |\n\nVisit [your account](https://acme.test/account).',
        preview: 'Your account is ready',
      })
    ).json().id;
    const email = await until(() => getEmail(id), (e) => e.last_event === 'sent');
    expect(email.message_id).toBe(`${id}@acme.test`);
    const [mail] = received(email.message_id);
    expect(mail).toBeDefined();
    expect(mail!.from?.value).toEqual([{ name: 'Acme Support', address: 'support@acme.test' }]);
    expect(mail!.subject).toBe('Welcome, Jane');
    expect(mail!.headers.get('to')).toMatchObject({ value: [{ address: 'jane@example.com' }] });
    expect(mail!.headers.get('reply-to')).toMatchObject({ value: [{ address: 'help@acme.test' }] });
    // The preheader, GFM table and inlined CSS are in the HTML part.
    expect(mail!.html).toContain('Your account is ready');
    expect(mail!.html).toMatch(/<h1 style="[^"]+">Hello Jane<\/h1>/);
    expect(mail!.html).toMatch(/<table style="border-collapse: collapse;[^"]*">/);
    expect(mail!.html).toMatch(/<th style="[^"]+">plan<\/th>/);
    expect(mail!.html).not.toContain('<style>');
    expect(mail!.text).toMatch(/PLAN +PRICE/);
    // The text part was generated from the HTML, without the preheader.
    expect(mail!.text).toContain('Hello Jane');
    expect(mail!.text).toContain('your account [https://acme.test/account]');
    expect(mail!.text).not.toContain('Your account is ready');
    // What was sent is what is stored.
    expect(email.html).toBe(mail!.html);
    expect(email.text?.trim()).toBe(mail!.text?.trim());
  });

  it('fans a batch out into one send per email', async () => {
    const res = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/emails/batch',
      headers: bearer(token),
      payload: [1, 2, 3].map((i) => ({ from: 'a@acme.test', to: `fan${i}@example.com`, subject: `fan ${i}`, html: '<p>b</p>' })),
    });
    const ids: string[] = res.json().data.map((d: { id: string }) => d.id);
    await until(
      async () => (await Promise.all(ids.map((id) => getEmail(id)))).map((e) => e.last_event),
      (events) => events.every((e) => e === 'sent'),
    );
    for (const id of ids) expect(received(`${id}@acme.test`)).toHaveLength(1);
  });

  it('sends a tiptap document and the text given by the client', async () => {
    const tiptap = {
      type: 'doc',
      content: [
        { type: 'heading', attrs: { level: 2 }, content: [{ type: 'text', text: 'Order shipped' }] },
        { type: 'paragraph', content: [{ type: 'text', text: 'Track it ' }, { type: 'text', text: 'here', marks: [{ type: 'link', attrs: { href: 'https://acme.test/t/1' } }] }] },
      ],
    };
    const id = (await send({ from: 'orders@acme.test', to: 'jane@example.com', subject: 'Shipped', tiptap, text: 'Your order shipped.' })).json().id;
    const email = await until(() => getEmail(id), (e) => e.last_event === 'sent');
    const [mail] = received(email.message_id);
    expect(mail!.html).toMatch(/<h2 style="[^"]+">Order shipped<\/h2>/);
    expect(mail!.html).toContain('href="https://acme.test/t/1"');
    expect(mail!.text?.trim()).toBe('Your order shipped.');
    expect(email.text).toBe('Your order shipped.');
  });

  it('fails on a 5xx answer with the reason and the rendered message stored', async () => {
    sink.answer = (rcpt) => (rcpt === 'gone@example.com' ? { code: 550, message: 'No such user here' } : undefined);
    const id = (await send({ from: 'a@acme.test', to: 'gone@example.com', subject: 'x', markdown: '**Hello** there' })).json().id;
    const email = await until(() => getEmail(id), (e) => e.last_event !== 'queued');
    expect(email.last_event).toBe('failed');
    expect(email.message_id).toBeNull();
    // What was handed over (the spec's "stored rendered HTML body"), as for a sent email.
    expect(email.html).toMatch(/<strong>Hello<\/strong> there/);
    expect(email.text).toMatch(/HELLO there|Hello there/);
    const [row] = await ctx.services.orm.em.fork().execute<{ failure_reason: string; attempts: number }[]>('select failure_reason, attempts from emails where id = ?', [id]);
    expect(row!.failure_reason).toMatch(/550 No such user here/);
    expect(row!.attempts).toBe(1);
  });

  it.each([
    ['a 5xx', 550, 'No such user here'],
    ['a 4xx', 452, 'Mailbox full, try later'],
  ])('fails the email, not retried, when the relay refuses the to with %s and takes a copy', async (_label, code, message) => {
    sink.answer = (rcpt) => (rcpt === `refused-${code}@example.com` ? { code, message } : undefined);
    const id = (await send({ from: 'a@acme.test', to: `Refused <refused-${code}@example.com>`, cc: `copy-${code}@example.com`, subject: 'x', html: '<p>b</p>' })).json().id;
    const email = await until(() => getEmail(id), (e) => e.last_event !== 'queued');
    expect(email.last_event).toBe('failed');
    const [row] = await ctx.services.orm.em.fork().execute<{ failure_reason: string; attempts: number }[]>('select failure_reason, attempts from emails where id = ?', [id]);
    expect(row!.failure_reason).toMatch(new RegExp(`${code} ${message}`));
    expect(row!.attempts).toBe(1);
    // The copy has it, once.
    const envelopes = sink.messages.flatMap((m, i) => (m.messageId === `<${id}@acme.test>` ? [sink.envelopes[i]] : []));
    expect(envelopes).toEqual([[`copy-${code}@example.com`]]);
  });

  it('stays sent when the relay refuses only a copy', async () => {
    sink.answer = (rcpt) => (rcpt === 'refused-copy@example.com' ? { code: 550, message: 'No such user here' } : undefined);
    const id = (await send({ from: 'a@acme.test', to: 'kept@example.com', bcc: 'refused-copy@example.com', subject: 'x', html: '<p>b</p>' })).json().id;
    const email = await until(() => getEmail(id), (e) => e.last_event !== 'queued');
    expect(email.last_event).toBe('sent');
    expect(received(`${id}@acme.test`)).toHaveLength(1);
  });

  it.each([
    ['a throttle answer (421)', 421, 'Too many messages, slow down', true],
    ['a throttle answer (450)', 450, 'Rate limited', true],
    ['another transient answer (432)', 432, 'Temporary trouble', false],
  ])('retries %s later and sends once it passes', async (_label, code, message, throttle) => {
    const rcpt = `later-${code}@example.com`;
    let refusals = 0;
    sink.answer = (r) => (r === rcpt && refusals++ === 0 ? { code, message } : undefined);
    const id = (await send({ from: 'a@acme.test', to: rcpt, subject: 'x', html: '<p>x</p>' })).json().id;
    const queue = ctx.services.producer.queue('emails');
    // Refused once: back to queued, the job delayed with backoff (not failed).
    const job = await until(() => queue.getJob(id), (j) => j !== undefined && refusals === 1);
    await until(() => job!.getState(), (s) => s === 'delayed');
    const mid = await getEmail(id);
    expect(mid.last_event).toBe('queued');
    const data = (await queue.getJob(id))!;
    // A throttle spends no attempt; another transient error does.
    expect(data.attemptsMade).toBe(throttle ? 0 : 1);
    if (throttle) expect(data.data.throttled).toBe(1);
    await data.promote();
    const email = await until(() => getEmail(id), (e) => e.last_event === 'sent');
    expect(received(email.message_id)).toHaveLength(1);
  });

  /**
   * An email written straight to the table: no job, so only the test's own calls may send it.
   * Created "in an hour": the reconciler of the running workers (grace 0 here) re-enqueues only
   * emails created before its run, and would otherwise send it first when its run comes while
   * the test does (a test run alone starts right after the workers' first reconcile).
   */
  async function insertUnqueuedEmail(id: string, to: string): Promise<string> {
    const em = ctx.services.orm.em.fork();
    const [org] = await em.execute<{ id: string }[]>('select id from organizations limit 1');
    await em.execute(
      `insert into emails (id, organization_id, from_address, to_address, subject, content_kind, content, created_at)
       values (?, ?, 'a@acme.test', ?, 'once', 'html', '<p>once</p>', now() + interval '1 hour')`,
      [id, org!.id, to],
    );
    return id;
  }

  it('hands an email over once even when asked twice at the same time or again later', async () => {
    sink.answer = undefined;
    const id = await insertUnqueuedEmail('eml_01m0000000000000000000dupe', 'dupe@example.com');
    // Two stores: as two worker processes; the same store twice: as two jobs of one process.
    const [a, b] = [new DeliveryStore(ctx.services.orm), new DeliveryStore(ctx.services.orm)];
    const results = await Promise.all([a, a, b].map((store) => deliverEmail(store, ctx.services.mailer, id, { finalAttempt: false })));
    expect(results.filter((r) => r.outcome === 'sent')).toHaveLength(1);
    expect(results.filter((r) => r.outcome === 'skipped')).toHaveLength(2);
    // A retried or re-added job after the send: skipped.
    await ctx.services.producer.add('emails', { name: 'send', data: { emailId: id }, jobId: id });
    const job = await until(() => ctx.services.producer.queue('emails').getJob(id), (j) => j?.finishedOn !== undefined);
    expect(job!.returnvalue).toEqual({ outcome: 'skipped', status: 'sent' });
    expect(received(`${id}@acme.test`)).toHaveLength(1);
  });

  it('makes no logger for an email sent without anything to log', async () => {
    sink.answer = undefined;
    const id = await insertUnqueuedEmail('eml_01m0000000000000000000nolog', 'quiet@example.com');
    // The worker's job logger is a getter that makes a child logger on first use (runner.ts).
    let made = 0;
    const options = {
      finalAttempt: false,
      get log() {
        made++;
        return ctx.services.logger;
      },
    };
    expect(await deliverEmail(new DeliveryStore(ctx.services.orm), ctx.services.mailer, id, options)).toMatchObject({ outcome: 'sent' });
    expect(received(`${id}@acme.test`)).toHaveLength(1);
    expect(made).toBe(0);
  });

  it('prepares the statements of the claim and the write-back once on their connection', async () => {
    sink.answer = undefined;
    const id = await insertUnqueuedEmail('eml_01m0000000000000000000prep', 'prepared@example.com');
    const prepared = await preparedOnOneConnection(ctx.env.config.databaseUrl, async (orm) => {
      expect(await deliverEmail(new DeliveryStore(orm), ctx.services.mailer, id, { finalAttempt: false })).toMatchObject({ outcome: 'sent' });
    });
    // Planned anew, the outbox insert of the write-back cost PostgreSQL four times its execution.
    expect(prepared).toEqual(expect.arrayContaining(['mailroom_emails_claim', 'mailroom_emails_sent', 'mailroom_outbox_sent']));
  });
});

describe('reconciler', () => {
  it('sends every accepted email exactly once after Redis lost its data', async () => {
    await workers?.close();
    workers = undefined;
    sink.answer = undefined;
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await send({ from: 'a@acme.test', to: `lost${i}@example.com`, subject: `lost ${i}`, html: '<p>x</p>' })).json().id);
    ids.push(
      ...(
        await ctx.app.inject({
          method: 'POST',
          url: '/api/v2/emails/batch',
          headers: bearer(token),
          payload: [1, 2, 3].map((i) => ({ from: 'a@acme.test', to: `batch${i}@example.com`, subject: 'b', html: '<p>b</p>' })),
        })
      ).json().data.map((d: { id: string }) => d.id),
    );
    // Redis restarted empty: every key of this test's prefix is gone.
    const keys = await ctx.services.redis.keys(`${ctx.env.config.redisPrefix}:*`);
    if (keys.length) await ctx.services.redis.del(...keys);
    expect(await ctx.services.producer.queue('emails').getJob(ids[0]!)).toBeUndefined();

    workers = await startEmailWorkers(ctx);
    await ctx.services.producer.add('emails', { name: 'reconcile', data: {} });
    await until(
      async () => (await Promise.all(ids.map((id) => getEmail(id)))).map((e) => e.last_event),
      (events) => events.every((e) => e === 'sent'),
    );
    for (const id of ids) expect(received(`${id}@acme.test`)).toHaveLength(1);
    // A second run finds nothing to do.
    await ctx.services.producer.add('emails', { name: 'reconcile', data: {} }, );
    await new Promise((r) => setTimeout(r, 300));
    for (const id of ids) expect(received(`${id}@acme.test`)).toHaveLength(1);
  });

  it('fails an email whose hand-over was interrupted instead of sending it twice', async () => {
    const id = (await send({ from: 'a@acme.test', to: 'x@example.com', subject: 'x', html: '<p>x</p>' })).json().id;
    await until(() => getEmail(id), (e) => e.last_event === 'sent');
    const em = ctx.services.orm.em.fork();
    const [org] = await em.execute<{ id: string }[]>('select organization_id as id from emails where id = ?', [id]);
    const stuck = 'eml_01m0000000000000000000stck';
    await em.execute(
      `insert into emails (id, organization_id, status, claimed_at, from_address, to_address, subject, content_kind, content)
       values (?, ?, 'sending', now() - interval '1 hour', 'a@acme.test', 'y@example.com', 's', 'html', '<p>s</p>')`,
      [stuck, org!.id],
    );
    await ctx.services.producer.add('emails', { name: 'reconcile', data: {} });
    const email = await until(() => getEmail(stuck), (e) => e.last_event === 'failed');
    expect(email.message_id).toBeNull();
    expect(received(`${stuck}@acme.test`)).toHaveLength(0);
  });
});

describe('reconciler and send-batch jobs still to expand', () => {
  it('does not enqueue again the emails of a waiting send-batch job, but still the older ones whose job is lost', async () => {
    // No worker: the batch stays waiting (prioritized) and the reconcile handler is run here.
    await workers?.close();
    workers = undefined;
    const lost = (await send({ from: 'a@acme.test', to: 'lost-before-batch@example.com', subject: 'lost', html: '<p>l</p>' })).json().id as string;
    const queue = ctx.services.producer.queue('emails');
    await queue.remove(lost);
    const em = ctx.services.orm.em.fork();
    // Older than the batch by more than the reconciler's clock slack (5 s).
    await em.execute(`update emails set created_at = now() - interval '1 minute' where id = ?`, [lost]);
    const batch = await ctx.app.inject({
      method: 'POST',
      url: '/api/v2/emails/batch',
      headers: bearer(token),
      payload: [1, 2, 3].map((i) => ({ from: 'a@acme.test', to: `waiting${i}@example.com`, subject: 'w', html: '<p>w</p>' })),
    });
    const batchIds = batch.json().data.map((d: { id: string }) => d.id as string);
    expect((await queue.getJob(`batch-${batchIds[0]}`))?.name).toBe('send-batch');

    const reconcile = emailSendProcessor('emails', { reconcileGraceMs: 0 }).handlers.reconcile;
    const job = (await queue.getJob(`batch-${batchIds[0]}`))!;
    await reconcile({}, { services: ctx.services, em, log: ctx.services.logger, job });
    expect((await queue.getJob(lost))?.name).toBe('send');
    for (const id of batchIds) expect(await queue.getJob(id)).toBeUndefined();
  });
});

describe('metrics of the send path', () => {
  it("counts an email whose final dot got no answer as failed{reason=interrupted} (docs/operations.md)", async () => {
    await workers?.close();
    workers = undefined;
    const id = (await send({ from: 'a@acme.test', to: 'no-answer@example.com', subject: 'n', html: '<p>n</p>' })).json().id as string;
    const job = (await ctx.services.producer.queue('emails').getJob(id))!;
    // A relay that drops the connection after the final `.`, before its answer.
    const mailer: MailTransport = {
      kind: 'smtp',
      async send(message) {
        await message.beforeCommit?.();
        message.onCommit?.();
        throw Object.assign(new Error('Connection closed unexpectedly'), { code: 'ECONNECTION' });
      },
      setDkimResolver() {},
      close() {},
    };
    const failed = async (reason: string) => (await ctx.services.metrics.emailsFailed.get()).values.find((v) => v.labels.reason === reason)?.value ?? 0;
    const before = { interrupted: await failed('interrupted'), rejected: await failed('rejected') };
    const services = Object.create(ctx.services, { mailer: { value: mailer } }) as typeof ctx.services;
    const result = await emailSendProcessor('emails').handlers.send({ emailId: id }, { services, em: ctx.services.orm.em.fork(), log: ctx.services.logger, job });
    expect(result).toMatchObject({ outcome: 'failed', reason: expect.stringContaining(UNCERTAIN_REASON) });
    expect(await failed('interrupted')).toBe(before.interrupted + 1);
    expect(await failed('rejected')).toBe(before.rejected);
  });
});

describe('MAIL_TRANSPORT=file', () => {
  it('writes an RFC 5322 .eml file and reads delivered', async () => {
    const fileCtx = await createTestContext({ MAIL_TRANSPORT: 'file' });
    const org = await createOrg(fileCtx.services);
    const connection = createRedis(fileCtx.env.config.redisUrl, 'worker');
    const running = await startWorkers(fileCtx.services, connection, [emailSendProcessor('emails')]);
    try {
      const id = (await send({ from: 'Acme <hi@acme.test>', to: 'jane@example.com', subject: 'File', html: '<html><body><p>Hi</p></body></html>', preview: 'peek' }, fileCtx, org.token)).json().id;
      const email = await until(() => getEmail(id, fileCtx, org.token), (e) => e.last_event !== 'queued');
      expect(email.last_event).toBe('delivered');
      const raw = await readFile(join(fileCtx.env.config.mail.outboxDir, `${id}.eml`));
      expect(raw.toString()).toContain('\r\n');
      const mail = await simpleParser(raw);
      expect(mail.messageId).toBe(`<${id}@acme.test>`);
      expect(mail.subject).toBe('File');
      expect(mail.html).toMatch(/<body><div class="preheader"[^>]*>peek<\/div><p>Hi<\/p>/);
      expect(mail.text?.trim()).toBe('Hi');
    } finally {
      await running.close();
      connection.disconnect();
      await fileCtx.close();
    }
  });
});

describe('MAIL_RATE_PER_SECOND', () => {
  it('caps sends a second with the queue-wide limiter', async () => {
    const limited = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, MAIL_RATE_PER_SECOND: '4' });
    const org = await createOrg(limited.services);
    const connection = createRedis(limited.env.config.redisUrl, 'worker');
    const running = await startWorkers(limited.services, connection, [emailSendProcessor('emails')]);
    try {
      const body = Array.from({ length: 6 }, (_, i) => ({ from: 'a@rate.test', to: `r${i}@example.com`, subject: 'r', html: '<p>r</p>' }));
      const started = Date.now();
      const ids = (await limited.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers: bearer(org.token), payload: body })).json().data.map((d: { id: string }) => d.id);
      await until(
        async () => (await Promise.all(ids.map((id: string) => getEmail(id, limited, org.token)))).map((e) => e.last_event),
        (events) => events.every((e) => e === 'sent'),
      );
      // 4 in the first second, the other 2 in the next.
      expect(Date.now() - started).toBeGreaterThanOrEqual(900);
    } finally {
      await running.close();
      connection.disconnect();
      await limited.close();
    }
  });
});

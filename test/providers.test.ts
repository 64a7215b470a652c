import { execFileSync } from 'node:child_process';
import { createHmac, createSign, generateKeyPairSync, randomBytes, randomUUID, type KeyObject } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/api/app.js';
import { relayMessageId } from '../src/shared/providers/relay-id.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startTestWorkers, type TestWorkers } from './helpers/hooks-workers.js';
import { runService, type ServiceProcess } from './helpers/process.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';
import { until } from './helpers/until.js';

// The providers' own webhooks (docs/outcomes.md "The providers' own webhooks"), each fed payloads
// in the provider's documented shape, signed with keys this test makes: an SNS signing certificate
// served by a local HTTPS server (trusted by the API process through NODE_EXTRA_CA_CERTS), an ECDSA
// key for SendGrid, an HMAC key for Mailgun, basic auth for Postmark. Emails are real: sent through
// the worker to an SMTP sink that answers like SES (`250 Ok <its own id>`).
const POSTMARK = { user: 'postmark-hook', password: 'pm-secret-password' };
const MAILGUN_KEY = 'key-mailgun-signing-0123456789';
const sendgrid = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });

let dir: string;
let sink: SmtpSink;
let ctx: TestContext;
let token: string;
let workers: TestWorkers | undefined;
let https: Server;
let httpsBase: string;
let snsKey: KeyObject;
let certFetches = 0;
let confirmations = 0;
let api: ServiceProcess;
let apiBase: string;
/** The relay's id for each message it accepted, in order (SES style). */
const relayIds: string[] = [];

function openssl(args: string[]) {
  execFileSync('openssl', args, { stdio: 'ignore' });
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'mailroom-providers-'));
  // The HTTPS server's certificate (for `localhost`) and the SNS signing certificate.
  openssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'tls.key'), '-out', join(dir, 'tls.crt'), '-days', '2', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost']);
  openssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'sns.key'), '-out', join(dir, 'sns.crt'), '-days', '2', '-subj', '/CN=sns.amazonaws.com']);
  const { createPrivateKey } = await import('node:crypto');
  snsKey = createPrivateKey(readFileSync(join(dir, 'sns.key')));
  const certificate = readFileSync(join(dir, 'sns.crt'));
  https = createServer({ key: readFileSync(join(dir, 'tls.key')), cert: readFileSync(join(dir, 'tls.crt')) }, (req, res) => {
    if (req.url?.startsWith('/SimpleNotificationService-')) {
      certFetches++;
      res.writeHead(200, { 'content-type': 'application/x-pem-file' }).end(certificate);
    } else if (req.url?.startsWith('/?Action=ConfirmSubscription')) {
      confirmations++;
      res.writeHead(200, { 'content-type': 'text/xml' }).end('<ConfirmSubscriptionResponse/>');
    } else res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => https.listen(0, '127.0.0.1', resolve));
  httpsBase = `https://localhost:${(https.address() as AddressInfo).port}`;

  sink = await startSmtpSink();
  sink.queued = () => {
    const id = `0100018c${randomBytes(12).toString('hex')}-${randomUUID()}-000000`;
    relayIds.push(id);
    return `Ok ${id}`;
  };
  ctx = await createTestContext({
    MAIL_TRANSPORT: 'smtp',
    SMTP_URL: sink.url,
    SNS_CERT_HOST_PATTERN: '^localhost$',
    POSTMARK_WEBHOOK_USER: POSTMARK.user,
    POSTMARK_WEBHOOK_PASSWORD: POSTMARK.password,
    MAILGUN_WEBHOOK_SIGNING_KEY: MAILGUN_KEY,
    SENDGRID_WEBHOOK_PUBLIC_KEY: sendgrid.publicKey.export({ type: 'spki', format: 'der' }).toString('base64'),
  });
  ({ token } = await createOrg(ctx.services));
  workers = await startTestWorkers(ctx, [emailSendProcessor('emails', { reconcileGraceMs: 0 })]);

  // The SES endpoint fetches certificates over https: an API process that trusts the test's.
  api = runService('src/api/server.ts', [], { ...ctx.env.env, PORT: '0', LOG_LEVEL: 'info', NODE_EXTRA_CA_CERTS: join(dir, 'tls.crt') });
  apiBase = `http://127.0.0.1:${(await api.waitFor(/listening at http:\/\/127\.0\.0\.1:(\d+)/))[1]}`;
});

afterAll(async () => {
  api?.kill();
  await api?.exited;
  await workers?.close();
  await ctx?.close();
  await sink?.close();
  await new Promise((resolve) => https?.close(resolve));
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const sql = <T = Record<string, unknown>>(query: string, params: unknown[] = []) => ctx.services.orm.em.fork().execute<T[]>(query, params, 'all');

async function getEmail(id: string) {
  const response = await ctx.app.inject({ url: `/api/v2/emails/${id}`, headers: bearer(token) });
  expect(response.statusCode).toBe(200);
  return response.json() as { id: string; message_id: string; last_event: string };
}

interface Sent {
  id: string;
  to: string;
  messageId: string;
  /** The relay's id from its 250 answer, as recorded on the email. */
  relayId: string;
}

/** A real email, sent through the worker to the sink; resolves once it reads `sent`. */
async function sent(label: string, copies: { cc?: string[] } = {}): Promise<Sent> {
  const to = `${label}-${randomBytes(3).toString('hex')}@example.com`;
  const response = await ctx.app.inject({
    method: 'POST',
    url: '/api/v2/emails',
    headers: bearer(token),
    payload: { from: 'Acme <news@acme.test>', to, subject: 'Hi', html: '<p>Hello</p>', ...copies },
  });
  expect(response.statusCode).toBe(200);
  const id = response.json().id as string;
  const email = await until(() => getEmail(id), (e) => e.last_event === 'sent');
  const [row] = await sql<{ provider_message_id: string }>('select provider_message_id from emails where id = ?', [id]);
  return { id, to, messageId: email.message_id, relayId: row!.provider_message_id };
}

const lastEvent = async (id: string) => (await getEmail(id)).last_event;
const suppressed = async (address: string) => (await sql('select 1 from suppressions where address = ?', [address])).length > 0;
const events = async (id: string) => (await sql<{ type: string }>('select type from email_events where email_id = ? order by occurred_at, type', [id])).map((r) => r.type);

describe('the relay id recorded at hand-over', () => {
  it('is read from the 250 answers of SES, Postfix and SendGrid, and not from answers without one', () => {
    expect(relayMessageId('250 Ok 0100018c6d8c1a8f-4a1b-44b5-9c4e-1c2d3e4f5a6b-000000')).toBe('0100018c6d8c1a8f-4a1b-44b5-9c4e-1c2d3e4f5a6b-000000');
    expect(relayMessageId('250 2.0.0 Ok: queued as 4BXyz12Kq9')).toBe('4BXyz12Kq9');
    expect(relayMessageId('250 Ok: queued as LRzXl66xSc-jI5rfnmE5Dg')).toBe('LRzXl66xSc-jI5rfnmE5Dg');
    for (const none of ['250 OK: message queued', '250 Great success', '250 2.0.0 OK', undefined, '']) expect(relayMessageId(none)).toBeUndefined();
  });

  it('is stored on the email that the relay accepted', async () => {
    const email = await sent('relay');
    expect(email.relayId).toMatch(/^0100018c[0-9a-f]{24}-/);
    expect(relayIds).toContain(email.relayId);
  });
});

// ---- Amazon SES through SNS ----

type Sns = Record<string, string>;

function snsSign(message: Sns, version: '1' | '2' = '2'): Sns {
  const fields = message.Type === 'Notification' ? ['Message', 'MessageId', 'Subject', 'Timestamp', 'TopicArn', 'Type'] : ['Message', 'MessageId', 'SubscribeURL', 'Timestamp', 'Token', 'TopicArn', 'Type'];
  const canonical = fields.filter((f) => message[f] !== undefined).map((f) => `${f}\n${message[f]}\n`).join('');
  const signer = createSign(version === '1' ? 'RSA-SHA1' : 'RSA-SHA256');
  signer.update(canonical);
  return { ...message, SignatureVersion: version, Signature: signer.sign(snsKey, 'base64') };
}

const TOPIC = 'arn:aws:sns:eu-west-1:123456789012:mailroom-ses';

function snsNotification(ses: object, overrides: Sns = {}): Sns {
  return {
    Type: 'Notification',
    MessageId: randomUUID(),
    TopicArn: TOPIC,
    Message: JSON.stringify(ses),
    Timestamp: new Date().toISOString(),
    SigningCertURL: `${httpsBase}/SimpleNotificationService-test.pem`,
    UnsubscribeURL: `${httpsBase}/?Action=Unsubscribe`,
    ...overrides,
  };
}

/** An SES notification as SES writes it; SES replaced the Message-ID, so only its own id matches. */
function sesEvent(kind: 'Bounce' | 'Complaint' | 'Delivery' | 'DeliveryDelay', email: Sent, extra: object = {}) {
  return {
    notificationType: kind,
    mail: {
      timestamp: new Date().toISOString(),
      source: 'news@acme.test',
      messageId: email.relayId,
      destination: [email.to],
      headersTruncated: false,
      headers: [{ name: 'Message-ID', value: `<${email.relayId}@email.amazonses.com>` }],
      commonHeaders: { messageId: `<${email.relayId}@email.amazonses.com>`, subject: 'Hi' },
    },
    ...extra,
  };
}

function postSes(body: Sns | string) {
  return fetch(`${apiBase}/webhooks/ses`, {
    method: 'POST',
    // SNS posts its JSON as text/plain.
    headers: { 'content-type': 'text/plain; charset=UTF-8', 'x-amz-sns-message-type': typeof body === 'string' ? 'Notification' : body.Type! },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

describe('POST /webhooks/ses (Amazon SES through SNS)', () => {
  it('confirms a signed subscription by fetching SubscribeURL', async () => {
    const before = confirmations;
    const response = await postSes(
      snsSign({
        Type: 'SubscriptionConfirmation',
        MessageId: randomUUID(),
        Token: 'tok-123',
        TopicArn: TOPIC,
        Message: `You have chosen to subscribe to the topic ${TOPIC}.`,
        SubscribeURL: `${httpsBase}/?Action=ConfirmSubscription&TopicArn=${TOPIC}&Token=tok-123`,
        Timestamp: new Date().toISOString(),
        SigningCertURL: `${httpsBase}/SimpleNotificationService-test.pem`,
      }),
    );
    expect(response.status, await response.clone().text()).toBe(200);
    expect(await response.json()).toEqual({ confirmed: true });
    expect(confirmations).toBe(before + 1);
  });

  it('a permanent bounce (signature v1) makes the email bounced and suppresses the address; a replay has one effect', async () => {
    const email = await sent('ses-bounce');
    const bounce = sesEvent('Bounce', email, {
      bounce: { bounceType: 'Permanent', bounceSubType: 'General', bouncedRecipients: [{ emailAddress: email.to, action: 'failed', status: '5.1.1', diagnosticCode: 'smtp; 550 5.1.1 user unknown' }], timestamp: new Date().toISOString(), feedbackId: 'fb-1' },
    });
    const signed = snsSign(snsNotification(bounce), '1');
    const response = await postSes(signed);
    expect(response.status, await response.clone().text()).toBe(200);
    expect(await response.json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    expect(await lastEvent(email.id)).toBe('bounced');
    expect(await suppressed(email.to)).toBe(true);
    expect((await postSes(signed)).status).toBe(200);
    expect(await events(email.id)).toEqual(['bounced']);
  });

  it('a complaint (signature v2) makes it complained; a delivery makes another delivered; a delay is recorded and moves nothing', async () => {
    const complained = await sent('ses-complaint');
    await postSes(snsSign(snsNotification(sesEvent('Complaint', complained, { complaint: { complainedRecipients: [{ emailAddress: complained.to }], complaintFeedbackType: 'abuse' } }))));
    expect(await lastEvent(complained.id)).toBe('complained');
    expect(await suppressed(complained.to)).toBe(true);
    // A `not-spam` feedback report (the recipient says it is not spam) changes nothing, as by mail.
    const notSpam = await sent('ses-not-spam');
    const report = sesEvent('Complaint', notSpam, { complaint: { complainedRecipients: [{ emailAddress: notSpam.to }], complaintFeedbackType: 'not-spam' } });
    expect(await (await postSes(snsSign(snsNotification(report)))).json()).toEqual({ received: 0, applied: 0, ignored: 0 });
    expect(await lastEvent(notSpam.id)).toBe('sent');
    expect(await suppressed(notSpam.to)).toBe(false);

    const delivered = await sent('ses-delivery');
    const delay = snsSign(snsNotification(sesEvent('DeliveryDelay', delivered, { deliveryDelay: { delayType: 'MailboxFull', delayedRecipients: [{ emailAddress: delivered.to, diagnosticCode: '452 4.2.2 mailbox full' }] } })));
    expect(await (await postSes(delay)).json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    expect(await lastEvent(delivered.id)).toBe('sent');
    await postSes(snsSign(snsNotification(sesEvent('Delivery', delivered, { delivery: { recipients: [delivered.to], smtpResponse: '250 ok' } }))));
    expect(await lastEvent(delivered.id)).toBe('delivered');
    expect(await events(delivered.id)).toEqual(['delivery_delayed', 'delivered']);
    expect(await suppressed(delivered.to)).toBe(false);
  });

  it('refuses bad or missing signatures, stale messages and certificate URLs off the pattern or over http, without fetching them', async () => {
    const email = await sent('ses-forged');
    const bounce = sesEvent('Bounce', email, { bounce: { bounceType: 'Permanent', bouncedRecipients: [{ emailAddress: email.to }] } });
    const good = snsSign(snsNotification(bounce));
    const fetchesBefore = certFetches;
    const forged: (Sns | string)[] = [
      { ...good, Signature: snsSign(snsNotification(bounce)).Signature! },
      { ...good, Message: good.Message!.replace('Permanent', 'Transient') },
      { ...good, Signature: undefined as unknown as string },
      { ...good, SignatureVersion: '3' },
      snsSign(snsNotification(bounce, { Timestamp: new Date(Date.now() - 2 * 60 * 60 * 1000).toISOString() })),
      snsSign(snsNotification(bounce, { SigningCertURL: `${httpsBase.replace('https:', 'http:')}/SimpleNotificationService-test.pem` })),
      snsSign(snsNotification(bounce, { SigningCertURL: `${httpsBase.replace('localhost', '127.0.0.1')}/SimpleNotificationService-test.pem` })),
      snsSign(snsNotification(bounce, { SigningCertURL: `https://sns.eu-west-1.amazonaws.com.evil.test/cert.pem` })),
      '{"Type":"Notification"}',
    ];
    for (const body of forged) {
      const response = await postSes(body);
      expect(response.status, JSON.stringify(body).slice(0, 200)).toBe(401);
      expect(await response.json()).toMatchObject({ statusCode: 401, name: 'invalid_signature' });
    }
    // Nothing fetched: the allowed URL is cached since the first test, and the others are refused before any fetch.
    expect(certFetches - fetchesBefore).toBe(0);
    expect(await lastEvent(email.id)).toBe('sent');
    expect(await suppressed(email.to)).toBe(false);
    expect((await postSes('{not json')).status).toBe(400);
  });

  it('answers 200 to an event of a message it does not know, and ignores it', async () => {
    const unknown = { id: 'x', to: 'nobody@example.com', messageId: 'nothing@acme.test', relayId: 'no-such-relay-id' };
    const response = await postSes(snsSign(snsNotification(sesEvent('Delivery', unknown))));
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ received: 1, applied: 0, ignored: 1 });
  });
});

// ---- Postmark ----

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

function postmark(body: object | string, authorization: string | null = basic(POSTMARK.user, POSTMARK.password), app = ctx.app) {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (authorization !== null) headers.authorization = authorization;
  return app.inject({ method: 'POST', url: '/webhooks/postmark', headers, payload: typeof body === 'string' ? body : JSON.stringify(body) });
}

const postmarkBounce = (email: Sent, type = 'HardBounce') => ({
  RecordType: 'Bounce',
  ID: 4323372036854775,
  Type: type,
  TypeCode: type === 'HardBounce' ? 1 : 4096,
  Name: type === 'HardBounce' ? 'Hard bounce' : 'Soft bounce',
  Tag: '',
  MessageID: email.relayId,
  ServerID: 23,
  MessageStream: 'outbound',
  Description: 'The server was unable to deliver your message (ex: unknown user, mailbox not found).',
  Details: 'smtp;550 5.1.1 The email account that you tried to reach does not exist.',
  Email: email.to,
  From: 'news@acme.test',
  BouncedAt: new Date().toISOString(),
  DumpAvailable: true,
  Inactive: true,
  CanActivate: true,
  Subject: 'Hi',
  Content: '',
  Metadata: {},
});

describe('POST /webhooks/postmark', () => {
  it('reads a HardBounce, a SpamComplaint and a Delivery; a soft bounce does not suppress; a replay has one effect', async () => {
    const bounced = await sent('pm-bounce');
    expect((await postmark(postmarkBounce(bounced))).json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    await postmark(postmarkBounce(bounced));
    expect(await lastEvent(bounced.id)).toBe('bounced');
    expect(await suppressed(bounced.to)).toBe(true);
    expect(await events(bounced.id)).toEqual(['bounced']);

    const soft = await sent('pm-soft');
    await postmark(postmarkBounce(soft, 'SoftBounce'));
    expect(await lastEvent(soft.id)).toBe('bounced');
    expect(await suppressed(soft.to)).toBe(false);

    const complained = await sent('pm-complaint');
    await postmark({ RecordType: 'SpamComplaint', ID: 42, Type: 'SpamComplaint', TypeCode: 512, MessageID: complained.relayId, Email: complained.to, From: 'news@acme.test', BouncedAt: new Date().toISOString(), MessageStream: 'outbound' });
    expect(await lastEvent(complained.id)).toBe('complained');
    expect(await suppressed(complained.to)).toBe(true);

    const delivered = await sent('pm-delivery');
    await postmark({ RecordType: 'Delivery', ServerID: 23, MessageStream: 'outbound', MessageID: delivered.relayId, Recipient: delivered.to, Tag: '', DeliveredAt: new Date().toISOString(), Details: 'Test delivery webhook details', Metadata: {} });
    expect(await lastEvent(delivered.id)).toBe('delivered');
  });

  it('answers 401 without or with wrong credentials, 400 to malformed JSON, 200 to an unknown message, 404 when not configured', async () => {
    const email = await sent('pm-forged');
    for (const auth of [null, basic(POSTMARK.user, 'wrong'), basic('other', POSTMARK.password), 'Bearer x', 'Basic !!!']) {
      const response = await postmark(postmarkBounce(email), auth);
      expect(response.statusCode, String(auth)).toBe(401);
    }
    expect(await lastEvent(email.id)).toBe('sent');
    const unparsable = await postmark('{oops');
    expect(unparsable.statusCode).toBe(400);
    expect(unparsable.json()).toMatchObject({ name: 'invalid_json' });
    expect((await postmark({ ...postmarkBounce(email), MessageID: 'unknown-id' })).json()).toEqual({ received: 1, applied: 0, ignored: 1 });

    const app = await buildApp({ ...ctx.services, config: { ...ctx.services.config, providers: { ...ctx.services.config.providers, postmark: undefined } } });
    await app.ready();
    try {
      expect((await postmark(postmarkBounce(email), undefined, app as typeof ctx.app)).statusCode).toBe(404);
    } finally {
      await app.close();
    }
  });
});

// ---- Mailgun ----

function mailgunSigned(eventData: object, options: { key?: string; timestamp?: number } = {}) {
  const timestamp = String(options.timestamp ?? Math.floor(Date.now() / 1000));
  const tokenValue = randomBytes(25).toString('hex');
  const signature = createHmac('sha256', options.key ?? MAILGUN_KEY).update(timestamp + tokenValue).digest('hex');
  return { signature: { timestamp, token: tokenValue, signature }, 'event-data': eventData };
}

const mailgunEvent = (event: string, email: Sent, extra: object = {}) => ({
  id: randomBytes(11).toString('base64url'),
  timestamp: Date.now() / 1000,
  'log-level': event === 'delivered' ? 'info' : 'error',
  event,
  recipient: email.to,
  'recipient-domain': 'example.com',
  message: { headers: { to: email.to, 'message-id': email.messageId, from: 'news@acme.test', subject: 'Hi' }, attachments: [], size: 1234 },
  ...extra,
});

function mailgun(body: object | string) {
  return ctx.app.inject({ method: 'POST', url: '/webhooks/mailgun', headers: { 'content-type': 'application/json' }, payload: typeof body === 'string' ? body : JSON.stringify(body) });
}

describe('POST /webhooks/mailgun', () => {
  it('reads failed (permanent = hard, temporary = soft), complained and delivered by the Message-ID mailroom set', async () => {
    const bounced = await sent('mg-bounce');
    const failed = mailgunSigned(mailgunEvent('failed', bounced, { severity: 'permanent', reason: 'bounce', 'delivery-status': { code: 550, message: '5.1.1 The email account that you tried to reach does not exist', 'attempt-no': 1 } }));
    expect((await mailgun(failed)).json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    expect((await mailgun(failed)).statusCode).toBe(200);
    expect(await lastEvent(bounced.id)).toBe('bounced');
    expect(await suppressed(bounced.to)).toBe(true);
    expect(await events(bounced.id)).toEqual(['bounced']);

    const temporary = await sent('mg-soft');
    await mailgun(mailgunSigned(mailgunEvent('failed', temporary, { severity: 'temporary', reason: 'generic', 'delivery-status': { code: 452, message: 'mailbox full' } })));
    expect(await lastEvent(temporary.id)).toBe('bounced');
    expect(await suppressed(temporary.to)).toBe(false);

    const complained = await sent('mg-complaint');
    await mailgun(mailgunSigned(mailgunEvent('complained', complained)));
    expect(await lastEvent(complained.id)).toBe('complained');
    expect(await suppressed(complained.to)).toBe(true);

    const delivered = await sent('mg-delivery');
    await mailgun(mailgunSigned(mailgunEvent('delivered', delivered, { 'delivery-status': { code: 250, message: 'OK' } })));
    expect(await lastEvent(delivered.id)).toBe('delivered');
  });

  it('refuses a wrong key, a tampered token and a timestamp older than 10 minutes; 400 to malformed JSON; ignores other events', async () => {
    const email = await sent('mg-forged');
    const event = mailgunEvent('failed', email, { severity: 'permanent' });
    const tampered = mailgunSigned(event);
    tampered.signature.token = randomBytes(25).toString('hex');
    for (const body of [mailgunSigned(event, { key: 'other-key' }), tampered, mailgunSigned(event, { timestamp: Math.floor(Date.now() / 1000) - 11 * 60 }), { 'event-data': event }]) {
      const response = await mailgun(body);
      expect(response.statusCode).toBe(401);
      expect(response.json()).toMatchObject({ name: 'invalid_signature' });
    }
    // Ahead of this server's clock as much: refused too, saying which way the clock is off.
    const ahead = await mailgun(mailgunSigned(event, { timestamp: Math.floor(Date.now() / 1000) + 11 * 60 }));
    expect(ahead.statusCode).toBe(401);
    expect(ahead.json().message).toMatch(/more than 10 minutes away from this server's clock/);
    expect(await lastEvent(email.id)).toBe('sent');
    const unparsable = await mailgun('not json');
    expect(unparsable.statusCode).toBe(400);
    expect(unparsable.json()).toMatchObject({ name: 'invalid_json' });
    expect((await mailgun(mailgunSigned(mailgunEvent('opened', email)))).json()).toEqual({ received: 0, applied: 0, ignored: 0 });
  });
});

// ---- SendGrid ----

function sendgridPost(events: object[] | string, options: { key?: KeyObject; timestamp?: number; signature?: string | null } = {}) {
  const body = typeof events === 'string' ? events : JSON.stringify(events);
  const timestamp = String(options.timestamp ?? Math.floor(Date.now() / 1000));
  const signer = createSign('sha256');
  signer.update(timestamp + body);
  const headers: Record<string, string> = { 'content-type': 'application/json', 'x-twilio-email-event-webhook-timestamp': timestamp };
  if (options.signature !== null) headers['x-twilio-email-event-webhook-signature'] = options.signature ?? signer.sign(options.key ?? sendgrid.privateKey, 'base64');
  return ctx.app.inject({ method: 'POST', url: '/webhooks/sendgrid', headers, payload: body });
}

const sendgridEvent = (event: string, email: Sent, extra: object = {}) => ({
  email: email.to,
  timestamp: Math.floor(Date.now() / 1000),
  'smtp-id': `<${email.messageId}>`,
  event,
  category: ['receipts'],
  sg_event_id: randomBytes(16).toString('base64url'),
  sg_message_id: `${email.relayId}.filterdrecv-5645d9c87f-abcde-1-64B4E1F1-2.0`,
  ...extra,
});

describe('POST /webhooks/sendgrid', () => {
  it('reads a batch of bounce, spamreport, delivered, deferred and blocked events; a replayed batch has one effect', async () => {
    const [bounced, complained, delivered, blocked] = await Promise.all(['sg-bounce', 'sg-complaint', 'sg-delivery', 'sg-blocked'].map((label) => sent(label)));
    const batch = [
      sendgridEvent('bounce', bounced!, { type: 'bounce', status: '5.1.1', reason: '550 5.1.1 The email account that you tried to reach does not exist.' }),
      sendgridEvent('spamreport', complained!),
      sendgridEvent('deferred', delivered!, { response: '400 try again later', attempt: '1' }),
      sendgridEvent('delivered', delivered!, { response: '250 OK' }),
      // A block as SendGrid sends it: a `bounce` event of type `blocked` (about the sender, not the mailbox).
      sendgridEvent('bounce', blocked!, { type: 'blocked', status: '5.7.1', reason: '550 5.7.1 Client host blocked using Spamhaus', bounce_classification: 'Reputation' }),
      sendgridEvent('open', delivered!),
    ];
    expect((await sendgridPost(batch)).json()).toEqual({ received: 5, applied: 5, ignored: 0 });
    expect((await sendgridPost(batch)).statusCode).toBe(200);
    expect(await lastEvent(bounced!.id)).toBe('bounced');
    expect(await suppressed(bounced!.to)).toBe(true);
    expect(await events(bounced!.id)).toEqual(['bounced']);
    expect(await lastEvent(complained!.id)).toBe('complained');
    expect(await suppressed(complained!.to)).toBe(true);
    expect(await lastEvent(delivered!.id)).toBe('delivered');
    expect(await lastEvent(blocked!.id)).toBe('bounced');
    expect(await suppressed(blocked!.to)).toBe(false);
  });

  it('takes a hard bounce after a soft one in the same batch as the event: one row, hard, and the address suppressed', async () => {
    const email = await sent('sg-soft-then-hard');
    const batch = [
      sendgridEvent('bounce', email, { type: 'blocked', status: '5.7.1', reason: '550 5.7.1 blocked' }),
      sendgridEvent('bounce', email, { type: 'bounce', status: '5.1.1', reason: '550 5.1.1 user unknown' }),
    ];
    expect((await sendgridPost(batch)).statusCode).toBe(200);
    const rows = await ctx.services.orm.em.fork().execute<{ type: string }[]>(`select details->>'bounceType' as type from email_events where email_id = ? and type = 'bounced'`, [email.id]);
    expect(rows).toEqual([{ type: 'hard' }]);
    expect(await suppressed(email.to)).toBe(true);
  });

  it('matches by the SMTP answer id when the Message-ID is not carried', async () => {
    const email = await sent('sg-relay');
    const event = sendgridEvent('delivered', email);
    delete (event as Record<string, unknown>)['smtp-id'];
    expect((await sendgridPost([event])).json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    expect(await lastEvent(email.id)).toBe('delivered');
  });

  it('refuses a missing, wrong-key or stale signature and a body changed after signing; 400 to malformed JSON', async () => {
    const email = await sent('sg-forged');
    const events1 = [sendgridEvent('bounce', email)];
    const other = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
    for (const response of [
      await sendgridPost(events1, { signature: null }),
      await sendgridPost(events1, { key: other.privateKey }),
      await sendgridPost(events1, { timestamp: Math.floor(Date.now() / 1000) - 11 * 60 }),
      await sendgridPost(events1, { signature: 'bm90IGEgc2lnbmF0dXJl' }),
    ]) {
      expect(response.statusCode).toBe(401);
    }
    const timestamp = String(Math.floor(Date.now() / 1000));
    const signer = createSign('sha256');
    signer.update(timestamp + JSON.stringify(events1));
    const changed = await ctx.app.inject({
      method: 'POST',
      url: '/webhooks/sendgrid',
      headers: { 'content-type': 'application/json', 'x-twilio-email-event-webhook-timestamp': timestamp, 'x-twilio-email-event-webhook-signature': signer.sign(sendgrid.privateKey, 'base64') },
      payload: JSON.stringify([{ ...events1[0], event: 'spamreport' }]),
    });
    expect(changed.statusCode).toBe(401);
    expect(await lastEvent(email.id)).toBe('sent');
    const unparsable = await sendgridPost('[{"event":');
    expect(unparsable.statusCode).toBe(400);
    expect(unparsable.json()).toMatchObject({ name: 'invalid_json' });
  });
});

describe('an event about a copy recipient (cc): the address it names, as a report by mail', () => {
  /** An email to one address with a copy to another, both fresh. */
  async function withCopy(label: string) {
    const copy = `${label}-copy-${randomBytes(3).toString('hex')}@example.com`;
    return { email: await sent(label, { cc: [`Copy Reader <${copy}>`] }), copy };
  }

  it('SES: a bounce listing the copy suppresses the copy, not the to, and leaves the email as it was', async () => {
    const { email, copy } = await withCopy('ses-cc');
    const bounce = sesEvent('Bounce', email, { bounce: { bounceType: 'Permanent', bouncedRecipients: [{ emailAddress: copy, status: '5.1.1', diagnosticCode: 'smtp; 550 5.1.1 copy unknown' }] } });
    expect(await (await postSes(snsSign(snsNotification(bounce)))).json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    expect(await suppressed(copy)).toBe(true);
    expect(await suppressed(email.to)).toBe(false);
    expect(await lastEvent(email.id)).toBe('sent');
    // A bounce listing both: each address its own, and the email bounced by its to.
    const both = await withCopy('ses-both');
    const twice = sesEvent('Bounce', both.email, { bounce: { bounceType: 'Permanent', bouncedRecipients: [{ emailAddress: both.email.to }, { emailAddress: both.copy }] } });
    expect(await (await postSes(snsSign(snsNotification(twice)))).json()).toEqual({ received: 2, applied: 2, ignored: 0 });
    expect([await suppressed(both.email.to), await suppressed(both.copy), await lastEvent(both.email.id)]).toEqual([true, true, 'bounced']);
  });

  it('SendGrid: a bounce of the copy beside a delivery of the to suppresses the copy only; an address that is no recipient is ignored', async () => {
    const { email, copy } = await withCopy('sg-cc');
    const batch = [sendgridEvent('delivered', email), sendgridEvent('bounce', email, { email: copy, type: 'bounce', reason: '550 5.1.1 copy unknown' }), sendgridEvent('spamreport', email, { email: 'stranger@example.com' })];
    expect((await sendgridPost(batch)).json()).toEqual({ received: 3, applied: 2, ignored: 1 });
    expect([await suppressed(copy), await suppressed(email.to), await suppressed('stranger@example.com'), await lastEvent(email.id)]).toEqual([true, false, false, 'delivered']);
  });

  it('an email without copies takes the event whatever address it names (forwarded mail names where it went)', async () => {
    const email = await sent('ses-forwarded');
    const bounce = sesEvent('Bounce', email, { bounce: { bounceType: 'Permanent', bouncedRecipients: [{ emailAddress: 'final@forwarded.example', status: '5.1.1' }] } });
    expect(await (await postSes(snsSign(snsNotification(bounce)))).json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    expect([await lastEvent(email.id), await suppressed(email.to)]).toEqual(['bounced', true]);
  });

  it('Mailgun and Postmark: a failure and a complaint naming the copy act on the copy', async () => {
    const one = await withCopy('mg-cc');
    expect((await mailgun(mailgunSigned(mailgunEvent('failed', one.email, { severity: 'permanent', recipient: one.copy })))).json()).toMatchObject({ applied: 1 });
    const other = await withCopy('pm-cc');
    expect((await postmark({ ...postmarkBounce(other.email, 'SpamComplaint'), RecordType: 'SpamComplaint', Email: other.copy })).json()).toMatchObject({ applied: 1 });
    expect([await suppressed(one.copy), await suppressed(one.email.to), await lastEvent(one.email.id)]).toEqual([true, false, 'sent']);
    expect([await suppressed(other.copy), await suppressed(other.email.to), await lastEvent(other.email.id)]).toEqual([true, false, 'sent']);
  });
});

describe('provider events the service cannot store or that are no failure', () => {
  it('a NUL in a diagnostic is replaced, one in an id makes its event ignored, and the rest of the batch is applied', async () => {
    const email = await sent('sg-nul');
    const batch = [
      sendgridEvent('deferred', email, { response: '451 a\u0000b' }),
      sendgridEvent('bounce', email, { 'smtp-id': '<a\u0000b@x>', sg_message_id: 'x\u0000y' }),
      sendgridEvent('spamreport', email),
    ];
    const response = await sendgridPost(batch);
    expect(response.statusCode, response.body).toBe(200);
    expect(response.json()).toEqual({ received: 3, applied: 2, ignored: 1 });
    expect(await lastEvent(email.id)).toBe('complained');
    // A diagnostic whose 2,000-character cut splits an emoji: no lone surrogate is written.
    const long = await sent('sg-long');
    const cut = await sendgridPost([sendgridEvent('bounce', long, { reason: `${'x'.repeat(1_999)}\u{1F600}` })]);
    expect(cut.json()).toEqual({ received: 1, applied: 1, ignored: 0 });
    expect(await lastEvent(long.id)).toBe('bounced');
  });

  it('Postmark: an AutoResponder is no bounce (ignored); BadEmailAddress is hard', async () => {
    const away = await sent('pm-away');
    expect((await postmark(postmarkBounce(away, 'AutoResponder'))).json()).toEqual({ received: 0, applied: 0, ignored: 0 });
    expect(await lastEvent(away.id)).toBe('sent');
    const bad = await sent('pm-bad');
    await postmark(postmarkBounce(bad, 'BadEmailAddress'));
    expect(await suppressed(bad.to)).toBe(true);
  });
});

describe('many events at once', () => {
  it('applies more concurrent delivery events than the connection pool holds (each write joins its transaction)', async () => {
    // Sent emails written directly: what is measured is the recorder under concurrency.
    const count = 40;
    const ids = Array.from({ length: count }, (_, i) => `eml_concurrent${String(i).padStart(4, '0')}`);
    const [{ id: organizationId }] = await sql<{ id: string }>('select organization_id as id from api_tokens limit 1');
    await sql(
      `insert into emails (id, organization_id, source, status, from_address, to_address, subject, content_kind, content, headers, message_id, sent_at, created_at, updated_at)
       select v.id, ?, 'api', 'sent', 'news@acme.test', v.id || '@example.com', 'Hi', 'html', '<p>x</p>', '{}'::jsonb, v.id || '@acme.test', now(), now(), now()
       from jsonb_array_elements_text(?::jsonb) as v(id)`,
      [organizationId, JSON.stringify(ids)],
    );
    const started = Date.now();
    const answers = await Promise.all(
      ids.map((id) => mailgun(mailgunSigned(mailgunEvent('delivered', { id, to: `${id}@example.com`, messageId: `${id}@acme.test`, relayId: '' })))),
    );
    expect(answers.map((a) => a.statusCode)).toEqual(ids.map(() => 200));
    // Before the fix every pooled connection waited for a second one until the acquire timeout.
    expect(Date.now() - started).toBeLessThan(10_000);
    const [row] = await sql<{ n: number }>(`select count(*)::int as n from emails where id in (select jsonb_array_elements_text(?::jsonb)) and delivery_status = 'delivered'`, [JSON.stringify(ids)]);
    expect(row!.n).toBe(count);
    const [proven] = await sql<{ n: number }>(`select count(*)::int as n from verification_history where email in (select jsonb_array_elements_text(?::jsonb)) and proven_at is not null`, [
      JSON.stringify(ids.map((id) => `${id}@example.com`)),
    ]);
    expect(proven!.n).toBe(count);
  });
});

describe('a provider whose secret is not configured', () => {
  it('answers 404 on every provider endpoint (docs/outcomes.md)', async () => {
    const config = ctx.services.config;
    const off = { ...config.providers, ses: { ...config.providers.ses, enabled: false }, postmark: undefined, mailgunSigningKey: undefined, sendgridPublicKey: undefined };
    const app = await buildApp({ ...ctx.services, config: { ...config, providers: off } });
    await app.ready();
    try {
      for (const provider of ['ses', 'postmark', 'mailgun', 'sendgrid']) {
        const response = await app.inject({ method: 'POST', url: `/webhooks/${provider}`, headers: { 'content-type': 'application/json' }, payload: '{}' });
        expect(response.statusCode, provider).toBe(404);
        expect(response.json()).toMatchObject({ name: 'not_found' });
      }
    } finally {
      await app.close();
    }
  });
});

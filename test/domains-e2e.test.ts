import { dkimVerify } from 'mailauth/lib/dkim/verify.js';
import { Resolver } from 'node:dns/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { domainsProcessor } from '../src/workers/domains.js';
import { emailsProcessor } from '../src/workers/emails.js';
import { startWorkers, type QueueProcessor, type RunningWorkers } from '../src/workers/runner.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { publishDomainRecords, startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { startSmtpSink, type SmtpSink } from './helpers/smtp-sink.js';

// Issue 7 "done when": a domain created through the API becomes VERIFIED once its records
// are published, and mail sent from it carries a DKIM signature that verifies. With
// ALLOW_UNVERIFIED_DOMAINS=false, sending from it before that is refused.

let ctx: TestContext;
let dns: TestDnsServer;
let sink: SmtpSink;
let workers: RunningWorkers;
let token: string;

beforeAll(async () => {
  dns = await startDnsServer();
  sink = await startSmtpSink();
  ctx = await createTestContext({
    DNS_SERVERS: dns.address,
    MAIL_TRANSPORT: 'smtp',
    SMTP_URL: sink.url,
    ALLOW_UNVERIFIED_DOMAINS: 'false',
  });
  workers = await startWorkers(ctx.services, createRedis(ctx.env.config.redisUrl, 'worker'), [
    domainsProcessor as QueueProcessor,
    emailsProcessor as QueueProcessor,
  ]);
  ({ token } = await createOrg(ctx.services));
});

afterAll(async () => {
  await workers?.close();
  await ctx?.close();
  await sink?.close();
  await dns?.close();
});

function api(method: 'GET' | 'POST', url: string, body?: unknown) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(token), ...(body === undefined ? {} : { payload: body as object }) });
}

async function until<T>(read: () => Promise<T>, done: (v: T) => boolean, timeoutMs = 15_000): Promise<T> {
  const started = Date.now();
  for (;;) {
    const value = await read();
    if (done(value) || Date.now() - started > timeoutMs) return value;
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('a sending domain end to end (issue 7)', () => {
  it('is refused before it is VERIFIED, then signs mail that verifies against the published key', async () => {
    const created = (await api('POST', '/domains', { domain: 'news.example' })).json();
    const send = { from: 'Acme <hello@news.example>', to: 'reader@example.org', subject: 'Signed', markdown: '# Hello' };

    const refused = await api('POST', '/emails', send);
    expect(refused.statusCode).toBe(422);
    expect(refused.json().message).toContain('news.example');
    const refusedBatch = await api('POST', '/emails/batch', [send]);
    expect(refusedBatch.statusCode).toBe(422);
    expect(refusedBatch.json().details[0].path).toBe('0.from');

    // SPF and the return-path MX share a name: publish each name's records together.
    publishDomainRecords(dns, created.dnsRecords);
    expect((await api('POST', `/domains/${created.domain}/verify`)).statusCode).toBe(200);
    const verified = await until(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (d) => d.status === 'VERIFIED');
    expect(verified.status).toBe('VERIFIED');

    const accepted = await api('POST', '/emails', send);
    expect(accepted.statusCode).toBe(200);
    const { id } = accepted.json();
    await until(async () => sink.messages.length, (n) => n > 0);
    const email = await until(() => api('GET', `/emails/${id}`).then((r) => r.json()), (e) => e.last_event === 'sent');
    expect(email.message_id).toBe(`${id}@news.example`);

    const raw = sink.raw[sink.messages.findIndex((m) => m.messageId === `<${id}@news.example>`)]!;
    expect(raw.toString()).toMatch(/^DKIM-Signature: .*d=news\.example/m);
    const resolver = new Resolver();
    resolver.setServers([dns.address]);
    const result = await dkimVerify(raw, { resolver: (name: string, type: string) => resolver.resolve(name, type as 'TXT') } as never);
    const signature = (result as { results: Array<{ signingDomain: string; status: { result: string } }> }).results[0]!;
    expect(signature.signingDomain).toBe('news.example');
    expect(signature.status.result).toBe('pass');
  });
});

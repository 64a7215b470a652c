import { Resolver } from 'node:dns/promises';
import { dkimVerify } from 'mailauth/lib/dkim/verify.js';
import nodemailer from 'nodemailer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Domain, Sender } from '../src/shared/db/entities/index.js';
import { assertSendingDomainAllowed, dkimOptionsFor, DkimKeyCache } from '../src/shared/domains/dkim.js';
import { canTransition, checkDomain, nextPendingCheck } from '../src/shared/domains/verification.js';
import { createRedis } from '../src/shared/redis.js';
import { domainsProcessor } from '../src/workers/domains.js';
import { startWorkers, type QueueProcessor, type RunningWorkers } from '../src/workers/runner.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';

let ctx: TestContext;
let dnsServer: TestDnsServer;
let workers: RunningWorkers;
let token: string;
let organizationId: string;
let otherToken: string;

interface DnsRecordBody {
  type: string;
  name: string;
  value: string;
  priority: number | null;
  ttl: number;
  purpose: string;
  status: string;
}

beforeAll(async () => {
  dnsServer = await startDnsServer();
  ctx = await createTestContext({ DNS_SERVERS: dnsServer.address, PUBLIC_URL: 'https://mail.mailroom.test' });
  workers = await startWorkers(ctx.services, createRedis(ctx.env.config.redisUrl, 'worker'), [domainsProcessor as QueueProcessor]);
  ({ token, organizationId } = await createOrg(ctx.services));
  ({ token: otherToken } = await createOrg(ctx.services, { name: 'Other' }));
});

afterAll(async () => {
  await workers?.close();
  await ctx?.close();
  await dnsServer?.close();
});

function api(method: 'GET' | 'POST' | 'DELETE', url: string, body?: unknown, as = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(as), ...(body === undefined ? {} : { payload: body as object }) });
}

async function addDomain(domain: string, as = token) {
  const res = await api('POST', '/domains', { domain }, as);
  expect(res.statusCode, res.body).toBe(200);
  return res.json() as { id: string; domain: string; status: string; dnsRecords: DnsRecordBody[]; message?: string };
}

/** Publishes the records as given (TXT and MX) on the test DNS server. */
function publish(records: DnsRecordBody[], purposes = ['dkim', 'spf', 'dmarc', 'return_path']) {
  const byName = new Map<string, { txt: string[]; mx: Array<{ priority: number; exchange: string }> }>();
  for (const r of records.filter((x) => purposes.includes(x.purpose))) {
    const entry = byName.get(r.name) ?? { txt: [], mx: [] };
    if (r.type === 'TXT') entry.txt.push(r.value);
    else entry.mx.push({ priority: r.priority ?? 10, exchange: r.value });
    byName.set(r.name, entry);
  }
  for (const [name, entry] of byName) dnsServer.set(name, { txt: entry.txt, mx: entry.mx, ttl: 300 });
}

async function waitFor<T>(read: () => Promise<T>, done: (value: T) => boolean, timeoutMs = 10_000): Promise<T> {
  const started = Date.now();
  for (;;) {
    const value = await read();
    if (done(value) || Date.now() - started > timeoutMs) return value;
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function countRows(entity: typeof Domain | typeof Sender): Promise<number> {
  return ctx.services.orm.em.fork().count(entity, {});
}

describe('POST /api/v2/domains (docs/domains.md "Records handed out")', () => {
  it('creates the domain with a DKIM key and the four records, NOT_STARTED', async () => {
    const body = await addDomain('Example.COM');
    expect(body).toMatchObject({ domain: 'example.com', status: 'NOT_STARTED', region: 'us-east-1', mailProviderRecords: [] });
    expect(body.id).toMatch(/^dom_[0-9a-z]{26}$/);
    expect(body.message).toContain('verify');
    const byPurpose = Object.fromEntries(body.dnsRecords.map((r) => [r.purpose, r]));
    expect(Object.keys(byPurpose).sort()).toEqual(['dkim', 'dmarc', 'return_path', 'spf']);
    expect(byPurpose.dkim).toMatchObject({ type: 'TXT', priority: null, ttl: 3600, status: 'NOT_STARTED' });
    expect(byPurpose.dkim.name).toMatch(/^mr[0-9a-z]{8}\._domainkey\.example\.com$/);
    expect(byPurpose.dkim.value).toMatch(/^v=DKIM1; k=rsa; p=[A-Za-z0-9+/]{360,}={0,2}$/);
    expect(byPurpose.spf).toMatchObject({ type: 'TXT', name: 'bounces.example.com', value: 'v=spf1 a:mail.mailroom.test ~all' });
    expect(byPurpose.dmarc).toMatchObject({ type: 'TXT', name: '_dmarc.example.com' });
    expect(byPurpose.dmarc.value).toMatch(/^v=DMARC1; p=none/);
    expect(byPurpose.return_path).toMatchObject({ type: 'MX', name: 'bounces.example.com', value: 'mail.mailroom.test', priority: 10 });

    const row = await ctx.services.orm.em.fork().findOneOrFail(Domain, { id: body.id });
    expect(row.dkimPrivateKeySealed).toMatch(/^v1\./);
    expect(row.dkimPrivateKeySealed).not.toContain('PRIVATE KEY');
    expect(ctx.services.box.open(row.dkimPrivateKeySealed)).toContain('BEGIN PRIVATE KEY');
  });

  it('stores an IDN as punycode and takes a region', async () => {
    const res = await api('POST', '/domains', { domain: 'bücher.example', region: 'eu-west-1' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ domain: 'xn--bcher-kva.example', region: 'eu-west-1' });
    expect((await api('GET', `/domains/${encodeURIComponent('bücher.example')}`)).json().domain).toBe('xn--bcher-kva.example');
  });

  it.each([
    ['no dot', 'localhost'],
    ['an IP address', '192.0.2.1'],
    ['a URL', 'https://example.org/path'],
    ['an address', 'me@example.org'],
    ['a leading hyphen', '-bad.example'],
    ['a long label', `${'a'.repeat(64)}.example`],
    ['spaces', 'exa mple.org'],
    ['empty', ''],
  ])('refuses %s with 422 and writes nothing', async (_label, domain) => {
    const before = await countRows(Domain);
    const res = await api('POST', '/domains', { domain });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(res.json().details[0].path).toBe('domain');
    expect(await countRows(Domain)).toBe(before);
  });

  it('refuses a bad region and a missing domain with 422', async () => {
    expect((await api('POST', '/domains', { domain: 'region.example', region: 'EU West' })).statusCode).toBe(422);
    expect((await api('POST', '/domains', {})).statusCode).toBe(422);
  });

  it('refuses a duplicate hostname in the organization, even concurrently', async () => {
    await addDomain('dup.example');
    const again = await api('POST', '/domains', { domain: 'DUP.example.' });
    expect(again.statusCode).toBe(422);
    expect(again.json().message).toContain('dup.example');
    const racing = await Promise.all([1, 2, 3].map(() => api('POST', '/domains', { domain: 'race.example' })));
    expect(racing.map((r) => r.statusCode).sort()).toEqual([200, 422, 422]);
    // Another organization may add the same hostname, with its own selector.
    const other = await addDomain('dup.example', otherToken);
    expect(other.domain).toBe('dup.example');
  });

  it('needs the domains permission', async () => {
    const limited = (await api('POST', '/tokens', { name: 'app', preset: 'app' })).json().token;
    for (const [method, url] of [['GET', '/domains'], ['POST', '/domains'], ['GET', '/senders']] as const) {
      const res = await api(method, url, method === 'POST' ? { domain: 'x.example' } : undefined, limited);
      expect(res.statusCode).toBe(403);
      expect(res.json().name).toBe('missing_permission');
    }
  });
});

describe('GET /api/v2/domains (docs/domains.md "Endpoints")', () => {
  it('lists with emailSendersCount, limit and has_more', async () => {
    const listed = await addDomain('listed.example');
    await api('POST', '/senders', { name: 'News', email: 'news@listed.example' });
    await api('POST', '/senders', { name: 'Help', email: 'help@listed.example' });
    const res = await api('GET', '/domains');
    expect(res.statusCode).toBe(200);
    const item = res.json().data.find((d: { id: string }) => d.id === listed.id);
    expect(item).toEqual({ id: listed.id, domain: 'listed.example', status: 'NOT_STARTED', region: 'us-east-1', createdAt: expect.any(String), emailSendersCount: 2 });
    const one = (await api('GET', '/domains?limit=1')).json();
    expect(one.data).toHaveLength(1);
    expect(one.has_more).toBe(true);
    expect((await api('GET', '/domains?limit=0')).statusCode).toBe(422);
    // Another organization sees only its own.
    const theirs = (await api('GET', '/domains', undefined, otherToken)).json().data;
    expect(theirs.map((d: { domain: string }) => d.domain)).toEqual(['dup.example']);
  });

  it('gets by id or hostname; unknown and foreign domains are 404', async () => {
    const created = await addDomain('get.example');
    const byId = await api('GET', `/domains/${created.id}`);
    expect(byId.statusCode).toBe(200);
    expect(byId.json()).toEqual(created);
    expect((await api('GET', '/domains/GET.example')).json().id).toBe(created.id);
    for (const path of ['/domains/unknown.example', '/domains/dom_01aaaaaaaaaaaaaaaaaaaaaaaa', '/domains/not a host']) {
      const res = await api('GET', path);
      expect(res.statusCode).toBe(404);
      expect(res.json().name).toBe('not_found');
    }
    expect((await api('GET', `/domains/${created.id}`, undefined, otherToken)).statusCode).toBe(404);
  });
});

describe('verification (docs/domains.md "Verification")', () => {
  it('verifies published records within seconds, even after a cached NXDOMAIN', async () => {
    const created = await addDomain('verified.example');
    const dkim = created.dnsRecords.find((r) => r.purpose === 'dkim')!;
    // Something looked the record up before it existed: NXDOMAIN is now in the cache.
    expect(await ctx.services.dns.txt(dkim.name)).toMatchObject({ kind: 'nxdomain' });
    publish(created.dnsRecords);

    const res = await api('POST', `/domains/${created.domain}/verify`);
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ id: created.id, status: 'PENDING' });
    expect(res.json().dnsRecords.every((r: DnsRecordBody) => r.status === 'PENDING')).toBe(true);

    const done = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.status === 'VERIFIED');
    expect(done.status).toBe('VERIFIED');
    expect(done.message).toBeUndefined();
    expect(done.dnsRecords.map((r: DnsRecordBody) => r.status)).toEqual(['VERIFIED', 'VERIFIED', 'VERIFIED', 'VERIFIED']);
    // The fresh lookup refreshed the shared cache too.
    expect(await ctx.services.dns.txt(dkim.name)).toMatchObject({ kind: 'answer', cacheHit: true });
  });

  it('stays PENDING with a message naming what is missing; DMARC is optional', async () => {
    const created = await addDomain('pending.example');
    publish(created.dnsRecords, ['dkim', 'dmarc']);
    await api('POST', `/domains/${created.id}/verify`);
    const body = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message?.startsWith('Waiting'));
    expect(body.status).toBe('PENDING');
    expect(body.message).toContain('SPF TXT record at bounces.pending.example not found');
    expect(body.message).not.toContain('DKIM');
    const statuses = Object.fromEntries(body.dnsRecords.map((r: DnsRecordBody) => [r.purpose, r.status]));
    expect(statuses).toEqual({ dkim: 'VERIFIED', spf: 'PENDING', dmarc: 'VERIFIED', return_path: 'PENDING' });

    // SPF with the user's own mechanisms added still counts as published as given.
    dnsServer.set('bounces.pending.example', { txt: ['v=spf1 include:_spf.other.example a:mail.mailroom.test -all'] });
    await api('POST', `/domains/${created.id}/verify`);
    const verified = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.status === 'VERIFIED');
    expect(verified.status).toBe('VERIFIED');
    expect(verified.dnsRecords.find((r: DnsRecordBody) => r.purpose === 'return_path').status).toBe('PENDING');
  });

  it('keeps SPF PENDING when receivers would not pass it: our mechanism after `all`, or two SPF records', async () => {
    const created = await addDomain('spf.example');
    publish(created.dnsRecords);
    const spf = created.dnsRecords.find((r) => r.purpose === 'spf')!;
    for (const txt of [['v=spf1 -all a:mail.mailroom.test'], ['v=spf1 a:mail.mailroom.test ~all', 'v=spf1 include:_spf.other.example ~all']]) {
      dnsServer.set(spf.name, { txt });
      await api('POST', `/domains/${created.id}/verify`);
      const body = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message?.startsWith('Waiting'));
      expect(body.status, txt.join(' | ')).toBe('PENDING');
      expect(body.message).toContain('SPF TXT record at bounces.spf.example does not hold the expected value');
    }
  });

  it('takes SPF with an explicit + qualifier (the default, RFC 7208 4.6.2) as published', async () => {
    const created = await addDomain('plus.example');
    publish(created.dnsRecords);
    dnsServer.set(created.dnsRecords.find((r) => r.purpose === 'spf')!.name, { txt: ['v=spf1 +a:mail.mailroom.test ~all'] });
    await api('POST', `/domains/${created.id}/verify`);
    expect((await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.status === 'VERIFIED')).status).toBe('VERIFIED');
    // An organization holds at most MAX_DOMAINS_PER_ORGANIZATION: this file's later tests add theirs.
    await api('DELETE', `/domains/${created.id}`);
  });

  it('keeps DKIM PENDING for our key published as a key receivers cannot use for our signatures (k= not rsa, h= without sha256)', async () => {
    const created = await addDomain('keytype.example');
    publish(created.dnsRecords);
    const dkim = created.dnsRecords.find((r) => r.purpose === 'dkim')!;
    const p = /p=([^;]+)/.exec(dkim.value)![1]!;
    for (const txt of [`v=DKIM1; k=ed25519; p=${p}`, `v=DKIM1; k=rsa; h=sha1; p=${p}`]) {
      dnsServer.set(dkim.name, { txt: [txt] });
      await api('POST', `/domains/${created.id}/verify`);
      const body = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message?.startsWith('Waiting'));
      expect(body.status, txt).toBe('PENDING');
      expect(body.message).toContain('DKIM TXT record');
    }
    dnsServer.set(dkim.name, { txt: [`v=DKIM1; k=RSA; h=sha1:sha256; p=${p}`] });
    await api('POST', `/domains/${created.id}/verify`);
    expect((await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.status === 'VERIFIED')).status).toBe('VERIFIED');
    await api('DELETE', `/domains/${created.id}`);
  });

  it('takes a 231-character hostname written with its trailing dot, whose every record name fits in 253', async () => {
    const name = `${'d'.repeat(63)}.${'d'.repeat(63)}.${'d'.repeat(63)}.${'c'.repeat(36)}.io`;
    expect(name).toHaveLength(231);
    const res = await api('POST', '/domains', { domain: `${name}.` });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json().domain).toBe(name);
    const names = res.json().dnsRecords.map((r: { name: string }) => r.name.replace(/\.$/, ''));
    expect(Math.max(...names.map((n: string) => n.length))).toBe(253);
    await api('DELETE', `/domains/${res.json().id}`);
    // One more, and its DKIM record name could not be published: refused, as a name over DNS's limit is.
    const tooLong = await api('POST', '/domains', { domain: `d.${name}.` });
    expect(tooLong.statusCode).toBe(422);
    expect(tooLong.json().details).toEqual([{ path: 'domain', message: expect.stringMatching(/^must be at most 231 characters .*_domainkey/) }]);
    const overDns = await api('POST', '/domains', { domain: `${'d'.repeat(22)}.${name}` });
    expect(overDns.statusCode).toBe(422);
    expect(overDns.json().details).toEqual([{ path: 'domain', message: 'must be at most 253 characters' }]);
  });

  it('reports a wrong DKIM key as not holding the expected value', async () => {
    const created = await addDomain('wrongkey.example');
    publish(created.dnsRecords);
    const dkim = created.dnsRecords.find((r) => r.purpose === 'dkim')!;
    dnsServer.set(dkim.name, { txt: ['v=DKIM1; k=rsa; p=AAAA'] });
    await api('POST', `/domains/${created.id}/verify`);
    const body = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message?.startsWith('Waiting'));
    expect(body.status).toBe('PENDING');
    expect(body.message).toContain('does not hold the expected value');
  });

  it('treats SERVFAIL as temporary: no state change, nothing cached', async () => {
    const created = await addDomain('servfail.example');
    publish(created.dnsRecords);
    const dkim = created.dnsRecords.find((r) => r.purpose === 'dkim')!;
    dnsServer.set(dkim.name, { servfail: true });
    await api('POST', `/domains/${created.id}/verify`);
    const body = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message !== undefined && b.message.includes('right now'));
    expect(body.status).toBe('PENDING');
    expect(body.message).toContain('could not be looked up right now (ESERVFAIL)');
    expect(await ctx.services.redis.exists(`${ctx.env.config.redisPrefix}:dns:txt:${dkim.name}`)).toBe(0);
    // The server recovers: the next check verifies.
    publish(created.dnsRecords);
    await api('POST', `/domains/${created.id}/verify`);
    expect((await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.status === 'VERIFIED')).status).toBe('VERIFIED');
  });

  it('puts a VERIFIED domain back to PENDING when its DKIM record disappears', async () => {
    const created = await addDomain('demoted.example');
    publish(created.dnsRecords);
    const em = ctx.services.orm.em.fork();
    await api('POST', `/domains/${created.id}/verify`);
    await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.status === 'VERIFIED');
    const row = await em.findOneOrFail(Domain, { id: created.id });
    expect(row.nextCheckAt!.getTime() - row.lastCheckedAt!.getTime()).toBe(24 * 3600_000);

    dnsServer.remove(created.dnsRecords.find((r) => r.purpose === 'dkim')!.name);
    const later = new Date(row.nextCheckAt!.getTime() + 1000);
    const checked = await checkDomain(ctx.services.orm.em.fork(), ctx.services.dns.fresh, created.id, later);
    expect(checked).toMatchObject({ status: 'PENDING' });
    expect(checked!.message).toMatch(/^A required record is no longer published: DKIM TXT record at .* not found/);
    expect(checked!.pendingSince).toEqual(later);
  });

  /** A check of the domain `hours` after its pending window opened. */
  async function checkAfter(id: string, hours: number) {
    const row = await ctx.services.orm.em.fork().findOneOrFail(Domain, { id });
    return checkDomain(ctx.services.orm.em.fork(), ctx.services.dns.fresh, id, new Date(row.pendingSince!.getTime() + hours * 3600_000));
  }

  it('fails after 72 hours pending, and verify starts a new window', async () => {
    const created = await addDomain('failing.example');
    await api('POST', `/domains/${created.id}/verify`);
    await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message?.startsWith('Waiting'));
    expect(await checkAfter(created.id, 71)).toMatchObject({ status: 'PENDING' });
    expect(await checkAfter(created.id, 72)).toMatchObject({ status: 'FAILED', nextCheckAt: null });
    const body = (await api('GET', `/domains/${created.id}`)).json();
    expect(body.status).toBe('FAILED');
    expect(body.message).toContain('72 hours');
    expect(body.dnsRecords.find((r: DnsRecordBody) => r.purpose === 'dkim').status).toBe('FAILED');
    expect((await api('POST', `/domains/${created.id}/verify`)).json().status).toBe('PENDING');
  });

  it('fails after 72 hours pending when a record could not be looked up all along (docs/domains.md), not pending for ever', async () => {
    const created = await addDomain('lame.example');
    publish(created.dnsRecords);
    dnsServer.set(created.dnsRecords.find((r) => r.purpose === 'dkim')!.name, { servfail: true });
    await api('POST', `/domains/${created.id}/verify`);
    await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message?.includes('right now'));
    expect(await checkAfter(created.id, 71)).toMatchObject({ status: 'PENDING' });
    expect(await checkAfter(created.id, 72)).toMatchObject({ status: 'FAILED', nextCheckAt: null });
    const body = (await api('GET', `/domains/${created.id}`)).json();
    expect(body.message).toMatch(/within 72 hours .*could not be looked up right now \(ESERVFAIL\)/);
    expect(body.dnsRecords.find((r: DnsRecordBody) => r.purpose === 'dkim').status).toBe('FAILED');
  });

  it('re-checks due domains from the scheduled sweep', async () => {
    const created = await addDomain('sweep.example');
    await api('POST', `/domains/${created.id}/verify`);
    await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.message?.startsWith('Waiting'));
    publish(created.dnsRecords);
    const em = ctx.services.orm.em.fork();
    const row = await em.findOneOrFail(Domain, { id: created.id });
    expect(row.nextCheckAt!.getTime() - row.lastCheckedAt!.getTime()).toBe(60_000);
    // Make it due now rather than waiting a minute, then run the sweep job.
    row.nextCheckAt = new Date(Date.now() - 1000);
    await em.flush();
    await ctx.services.producer.add('domains', { name: 'recheck-due', data: {}, jobId: 'sweep-test' });
    const verified = await waitFor(() => api('GET', `/domains/${created.id}`).then((r) => r.json()), (b) => b.status === 'VERIFIED');
    expect(verified.status).toBe('VERIFIED');
    const schedulers = await ctx.services.producer.queue('domains').getJobSchedulers();
    // The sweep ticks more often than the one-minute interval it serves: a record published
    // just after a check at T is seen by the check due at T+60 s, run by T+75 s.
    const every = schedulers.find((s) => s.key === 'domains-recheck')?.every;
    expect(every).toBe(15_000);
    expect(60_000 + Number(every)).toBeLessThanOrEqual(75_000);
  });

  it('backs off after the first hour and never schedules past 72 hours', () => {
    const since = new Date('2026-11-23T00:00:00.000Z');
    const gap = (hours: number) => {
      const now = new Date(since.getTime() + hours * 3600_000);
      return (nextPendingCheck(since, now).getTime() - now.getTime()) / 60_000;
    };
    expect(gap(0)).toBe(1);
    expect(gap(0.9)).toBe(1);
    expect(gap(2)).toBe(10);
    expect(gap(12)).toBe(30);
    expect(gap(48)).toBe(60);
    expect(gap(71.9)).toBeCloseTo(6, 5);
    // Past the deadline: at once (that check fails it).
    expect(gap(73)).toBe(0);
  });

  it('allows only the transitions of its table', () => {
    expect(canTransition('NOT_STARTED', 'PENDING')).toBe(true);
    expect(canTransition('NOT_STARTED', 'VERIFIED')).toBe(false);
    expect(canTransition('FAILED', 'VERIFIED')).toBe(false);
    expect(canTransition('VERIFIED', 'PENDING')).toBe(true);
    expect(canTransition('PENDING', 'FAILED')).toBe(true);
  });

  it('verify of an unknown or foreign domain is 404', async () => {
    expect((await api('POST', '/domains/nope.example/verify')).statusCode).toBe(404);
    const mine = await addDomain('mine.example');
    expect((await api('POST', `/domains/${mine.id}/verify`, undefined, otherToken)).statusCode).toBe(404);
  });
});

describe('DELETE /api/v2/domains/{domain}', () => {
  it('deletes the domain and its senders', async () => {
    const created = await addDomain('deleted.example');
    const sender = (await api('POST', '/senders', { name: 'Bye', email: 'bye@deleted.example' })).json();
    expect((await api('DELETE', `/domains/${created.id}`, undefined, otherToken)).statusCode).toBe(404);
    const res = await api('DELETE', '/domains/deleted.example');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ object: 'domain', id: created.id, deleted: true });
    expect((await api('GET', `/domains/${created.id}`)).statusCode).toBe(404);
    expect((await api('GET', `/senders/${sender.id}`)).statusCode).toBe(404);
    expect((await api('DELETE', '/domains/deleted.example')).statusCode).toBe(404);
  });
});

describe('senders (docs/domains.md "Endpoints")', () => {
  it('creates, lists and gets senders on the organization domains', async () => {
    await addDomain('senders.example');
    const res = await api('POST', '/senders', { name: 'Acme News', email: ' News@Senders.EXAMPLE ' });
    expect(res.statusCode).toBe(200);
    const sender = res.json();
    expect(sender).toMatchObject({ name: 'Acme News', email: 'news@senders.example' });
    expect(sender.id).toMatch(/^snd_[0-9a-z]{26}$/);
    expect((await api('GET', `/senders/${sender.id}`)).json()).toEqual(sender);
    const listed = (await api('GET', '/senders?limit=1')).json();
    expect(listed).toMatchObject({ object: 'list', data: [sender] });
    expect((await api('GET', `/senders/${sender.id}`, undefined, otherToken)).statusCode).toBe(404);
    expect((await api('GET', '/senders/snd_unknown')).statusCode).toBe(404);
  });

  it.each([
    ['a foreign domain', { name: 'X', email: 'x@not-mine.example' }, 'not a domain of this organization'],
    ['another organization domain', { name: 'X', email: 'x@dup.example.org' }, 'not a domain'],
    ['a subdomain', { name: 'X', email: 'x@sub.senders.example' }, 'not a domain'],
    ['an invalid address', { name: 'X', email: 'not-an-address' }, 'not a valid address'],
    // Only the part after the last @ is a domain of the organization: the rest must be one mailbox.
    ['a list of addresses', { name: 'X', email: 'service@paypal.com,news@senders.example' }, 'not a valid address'],
    ['two @', { name: 'X', email: 'a@evil.example@senders.example' }, 'not a valid address'],
    ['a quoted local part', { name: 'X', email: '"not an email"@senders.example' }, 'not a valid address'],
    ['a line break in the address', { name: 'X', email: 'a\r\nBcc: x@evil.example@senders.example' }, 'not a valid address'],
    ['a line break in the name', { name: 'News\r\nBcc: x@evil.example', email: 'b@senders.example' }, 'one line'],
    ['a control character in the name', { name: 'News\u000bX\u001b[31m', email: 'b@senders.example' }, 'control characters'],
    ['an empty name', { name: ' ', email: 'a@senders.example' }, ''],
  ])('refuses %s with 422 and writes nothing', async (_label, body, message) => {
    const before = await countRows(Sender);
    const res = await api('POST', '/senders', body);
    expect(res.statusCode).toBe(422);
    expect(res.json().name).toBe('validation_error');
    expect(res.json().message).toContain(message);
    expect(await countRows(Sender)).toBe(before);
  });

  it('refuses a sender on a domain only another organization has', async () => {
    const res = await api('POST', '/senders', { name: 'X', email: 'x@dup.example' }, otherToken);
    expect(res.statusCode).toBe(200);
    await addDomain('theirs-only.example', otherToken);
    const mine = await api('POST', '/senders', { name: 'X', email: 'x@theirs-only.example' });
    expect(mine.statusCode).toBe(422);
  });

  it('refuses a duplicate address with 422', async () => {
    await api('POST', '/senders', { name: 'One', email: 'same@senders.example' });
    const again = await api('POST', '/senders', { name: 'Two', email: 'SAME@senders.example' });
    expect(again.statusCode).toBe(422);
    expect(again.json().message).toContain('already exists');
  });
});

describe('DKIM signing and the unverified-domain rule', () => {
  it('gives nodemailer options whose signature verifies against the published key', async () => {
    const created = await addDomain('signed.example');
    publish(created.dnsRecords);
    const cache = new DkimKeyCache();
    const dkim = await dkimOptionsFor(ctx.services.orm.em.fork(), ctx.services.box, organizationId, 'Signed.Example', cache);
    expect(dkim).toMatchObject({ domainName: 'signed.example', keySelector: created.dnsRecords[0]!.name.split('.')[0] });
    expect(dkim!.headerFieldNames).toContain('list-unsubscribe-post');

    const transport = nodemailer.createTransport({ streamTransport: true, buffer: true, newline: 'windows' });
    const info = await transport.sendMail({
      from: 'News <news@signed.example>',
      to: 'someone@receiver.example',
      subject: 'Signed hello',
      text: 'Hello, signed world.\n',
      html: '<p>Hello, signed world.</p>',
      messageId: '<eml_01test@signed.example>',
      headers: { 'List-Unsubscribe': '<https://mail.mailroom.test/u/x>', 'List-Unsubscribe-Post': 'List-Unsubscribe=One-Click' },
      dkim: dkim!,
    });
    const message = info.message as Buffer;
    expect(message.toString()).toContain('DKIM-Signature: ');
    expect(message.toString()).toMatch(/c=relaxed\/relaxed/);

    const resolver = new Resolver();
    resolver.setServers([dnsServer.address]);
    const result = await dkimVerify(message, { resolver: (name: string, type: string) => resolver.resolve(name, type as 'TXT') } as never);
    expect(result.results).toHaveLength(1);
    expect(result.results[0]!.status.result).toBe('pass');
    expect(result.results[0]!.signingDomain).toBe('signed.example');

    // A tampered body no longer verifies.
    const tampered = Buffer.from(message.toString().replace('Hello, signed world.', 'Hello, forged world.'));
    const bad = await dkimVerify(tampered, { resolver: (name: string, type: string) => resolver.resolve(name, type as 'TXT') } as never);
    expect(bad.results[0]!.status.result).not.toBe('pass');
  });

  it('answers null for a domain the organization does not have, and caches briefly', async () => {
    const cache = new DkimKeyCache();
    const em = ctx.services.orm.em.fork();
    expect(await dkimOptionsFor(em, ctx.services.box, organizationId, 'someone@nowhere.example', cache)).toBeNull();
    expect(await dkimOptionsFor(em, ctx.services.box, organizationId, 'signed.example', cache)).not.toBeNull();
    expect(await dkimOptionsFor(em, ctx.services.box, 'org_other', 'signed.example', cache)).toBeNull();
  });

  it('forgets a cached key (or its absence) in every subscribed process as soon as a domain is added or deleted', async () => {
    const em = ctx.services.orm.em.fork();
    // A sending process's cache (its own subscription), not the API's.
    const cache = new DkimKeyCache();
    await cache.start(ctx.services);
    try {
      expect(await dkimOptionsFor(em, ctx.services.box, organizationId, 'news@announced.example', cache)).toBeNull();
      const created = await addDomain('announced.example');
      const found = await waitFor(() => dkimOptionsFor(ctx.services.orm.em.fork(), ctx.services.box, organizationId, 'news@announced.example', cache), (o) => o !== null, 3_000);
      expect(found).toMatchObject({ domainName: 'announced.example', keySelector: created.dnsRecords.find((r) => r.purpose === 'dkim')!.name.split('.')[0] });
      expect((await api('DELETE', `/domains/${created.id}`)).statusCode).toBe(200);
      expect(await waitFor(() => dkimOptionsFor(ctx.services.orm.em.fork(), ctx.services.box, organizationId, 'news@announced.example', cache), (o) => o === null, 3_000)).toBeNull();
    } finally {
      cache.close();
    }
  });

  it('keeps nothing while its subscription is not up (an announcement could be missed), and never subscribes again once closed', async () => {
    const unreachable = createRedis('redis://127.0.0.1:1', 'producer');
    unreachable.on('error', () => {});
    const cache = new DkimKeyCache();
    try {
      void cache.start({ redis: unreachable, config: ctx.services.config, logger: ctx.services.logger });
      cache.set(`${organizationId}:kept.example`, null);
      expect(cache.get(`${organizationId}:kept.example`)).toBeUndefined();
      cache.close();
      await cache.start(ctx.services);
      cache.set(`${organizationId}:kept.example`, null);
      // Closed: a cache of its TTL only, as one never started.
      expect(cache.get(`${organizationId}:kept.example`)).toEqual({ value: null });
    } finally {
      cache.close();
      unreachable.disconnect();
    }
  });

  it('with ALLOW_UNVERIFIED_DOMAINS=false refuses a domain that is not VERIFIED, naming it', async () => {
    const em = ctx.services.orm.em.fork();
    const strict = { allowUnverifiedDomains: false };
    await addDomain('unverified.example');
    for (const from of ['a@unverified.example', 'Name <a@unverified.example>', 'a@unknown-domain.example']) {
      const error = await assertSendingDomainAllowed(em, strict, organizationId, from).catch((e: unknown) => e);
      expect(error).toMatchObject({ statusCode: 422, errorName: 'validation_error' });
      expect((error as Error).message).toMatch(/unverified\.example|unknown-domain\.example/);
    }
    await expect(assertSendingDomainAllowed(em, strict, organizationId, 'News <news@verified.example>')).resolves.toBeUndefined();
    await expect(assertSendingDomainAllowed(em, { allowUnverifiedDomains: true }, organizationId, 'a@unverified.example')).resolves.toBeUndefined();
  });
});

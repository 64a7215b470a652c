import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DnsService } from '../src/shared/dns/resolver.js';
import { ISSUE_CODES, type IssueCode } from '../src/shared/verification/codes.js';
import {
  recordCatchAllDomain,
  recordComplaint,
  recordHardBounce,
  recordMailboxFull,
  recordMailboxNotFound,
  recordProven,
  recordSuppression,
} from '../src/shared/verification/index.js';
import { parseAddress } from '../src/shared/verification/syntax.js';
import { updateOrganization } from '../src/shared/organizations/service.js';
import { VerificationStore } from '../src/shared/verification/store.js';
import { suggestDomain } from '../src/shared/verification/typos.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { runCli } from './helpers/process.js';
import { VERIFICATION_ZONE } from './helpers/verification-fixtures.js';

let ctx: TestContext;
let dns: TestDnsServer;
let token: string;

beforeAll(async () => {
  dns = await startDnsServer(VERIFICATION_ZONE);
  ctx = await createTestContext({ DNS_SERVERS: dns.address, VERIFY_BLOCKED_DOMAINS: 'blocked.io, spammers.example.net' });
  ({ token } = await createOrg(ctx.services, { verifyQuota: 100_000 }));
});
afterAll(async () => {
  await ctx?.close();
  await dns?.close();
});

type Result = {
  id: string;
  email: string;
  result: string;
  accept: boolean;
  status: string;
  score: number | null;
  suggestion: string | null;
  traits: Record<string, unknown>;
  issues: Array<{ code: IssueCode; message: string; severity: string; retryable: boolean }>;
  quota: { limit: number; used: number; remaining: number; resets_at: string };
  retry_at: string | null;
  cache_hit: boolean;
};

async function verify(email: unknown, as = token, url = '/api/v2/verify') {
  const res = await ctx.app.inject({ method: 'POST', url, headers: bearer(as), payload: { email } as object });
  return res;
}

async function check(email: string, as = token): Promise<Result> {
  const res = await verify(email, as);
  expect(res.statusCode).toBe(200);
  return res.json() as Result;
}

const codes = (r: Result) => r.issues.map((i) => i.code);
const em = () => ctx.services.orm.em.fork();

describe('POST /api/v2/verify (docs/verification.md)', () => {
  it('answers a clean address on a routed domain: risky, accept, score 80, no issues (rule 3)', async () => {
    const r = await check(' Jane.Doe+news@Acme.IO ');
    expect(r).toMatchObject({
      object: 'email_verification',
      email: 'jane.doe+news@acme.io',
      result: 'risky',
      accept: true,
      status: 'completed',
      score: 80,
      suggestion: null,
      issues: [],
      retry_at: null,
      traits: { domain_category: 'business', disposable: false, free_provider: false, privacy_alias: false, role_based: false, suspicious_domain: false },
    });
    expect(r.id).toMatch(/^ver_[0-9a-z]{26}$/);
  });

  it('stores the result owned by the organization', async () => {
    const { organizationId } = await createOrg(ctx.services, { name: 'Store' });
    const other = await createOrg(ctx.services, { name: 'Store2' });
    const r = await check('someone@acme.io', other.token);
    const rows = await em().getConnection().execute('select organization_id, email, score, issues from email_verifications where id = ?', [r.id]);
    expect(rows[0]).toMatchObject({ organization_id: other.organizationId, email: 'someone@acme.io', score: 80, issues: [] });
    expect(rows[0].organization_id).not.toBe(organizationId);
  });

  it('answers the older path POST /api/v2/emails/verify the same way', async () => {
    const res = await verify('jane@acme.io', token, '/api/v2/emails/verify');
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ object: 'email_verification', result: 'risky', score: 80 });
  });

  it.each([
    ['missing email', {}],
    ['email of the wrong type', { email: 42 }],
    ['null email', { email: null }],
  ])('answers 422 validation_error for %s', async (_l, body) => {
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/verify', headers: bearer(token), payload: body });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(res.json().details[0].path).toBe('email');
    // The message names the field once, as every endpoint's does.
    expect(res.json().message).toBe('email: is required and must be a string');
  });

  it('is described in the OpenAPI document', async () => {
    const doc = (await ctx.app.inject({ url: '/api/v2/openapi.json' })).json();
    expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/api/v2/verify', '/api/v2/emails/verify']));
  });

  it('needs a token (401) and the emails permission (403)', async () => {
    expect((await ctx.app.inject({ method: 'POST', url: '/api/v2/verify', payload: { email: 'a@acme.io' } })).statusCode).toBe(401);
    const created = await ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(token), payload: { name: 'no emails', permissions: ['domains'] } });
    const res = await verify('a@acme.io', created.json().token);
    expect(res.statusCode).toBe(403);
    expect(res.json().name).toBe('missing_permission');
  });
});

describe('syntax (rule 1)', () => {
  it.each([
    'plainaddress',
    '@acme.io',
    'jane@',
    'jane@@acme.io',
    'a@b@acme.io',
    '.jane@acme.io',
    'jane.@acme.io',
    'ja..ne@acme.io',
    '"jane doe"@acme.io',
    'jane doe@acme.io',
    'jane@acme',
    'jane@-acme.io',
    'jane@acme-.io',
    'jane@ac_me.io',
    'jane@[192.0.2.1]',
    'jane@192.0.2.1',
    `${'a'.repeat(65)}@acme.io`,
    `a@${'b'.repeat(64)}.io`,
    `a@${Array.from({ length: 60 }, () => 'abcd').join('.')}.io`,
    'jané@acme.io',
    'jane(comment)@acme.io',
    `${'a'.repeat(5000)}@acme.io`,
    '',
  ])('refuses %j with invalid_format, score 0, 200', async (email) => {
    const r = await check(email);
    expect(r).toMatchObject({ result: 'undeliverable', accept: false, score: 0, status: 'completed' });
    expect(codes(r)[0]).toBe('invalid_format');
    expect(r.issues[0]).toMatchObject({ severity: 'error', retryable: false });
  });

  it('says an address far past any limit is too long (the cut of what is echoed does not change the reason)', async () => {
    const r = await check(`${'a'.repeat(200_000)}@acme.io`);
    expect(r.issues[0]).toMatchObject({ code: 'invalid_format', message: expect.stringContaining('longer than 254 octets') });
    expect(r.email.length).toBeLessThanOrEqual(1024);
  });

  it('accepts the RFC 5321 maximum lengths', () => {
    const local = 'a'.repeat(64);
    expect(parseAddress(`${local}@acme.io`).ok).toBe(true);
    const label = 'b'.repeat(63);
    const domain = `${label}.${label}.${label}.${'c'.repeat(58)}.io`; // 253 octets
    expect(domain.length).toBe(253);
    const long = parseAddress(`${local}@${domain}`);
    expect(long.ok).toBe(false); // 318 octets: over the 254 of a path
    expect(parseAddress(`${'a'.repeat(60)}@${'d'.repeat(63)}.${'e'.repeat(63)}.${'f'.repeat(60)}.io`).ok).toBe(true);
  });

  it('normalizes an IDN domain to its A-label and checks its routing', async () => {
    const r = await check('Jan@München.de');
    expect(r).toMatchObject({ email: 'jan@xn--mnchen-3ya.de', result: 'risky', score: 80, issues: [] });
  });
});

describe('lists (rules 1 and 4)', () => {
  it('rejects a disposable domain with disposable_email, score 10, and skips DNS', async () => {
    dns.resetCounts();
    const r = await check('jane@mailinator.com');
    expect(r).toMatchObject({ result: 'undeliverable', accept: false, score: 10, traits: { disposable: true, domain_category: 'disposable' } });
    expect(codes(r)).toEqual(['disposable_email']);
    expect(dns.count('mailinator.com')).toBe(0);
  });

  it('rejects a subdomain of a disposable domain too', async () => {
    expect(codes(await check('jane@inbox.mailinator.com'))).toEqual(['disposable_email']);
  });

  it('rejects an operator-blocked domain (VERIFY_BLOCKED_DOMAINS) with spam_domain', async () => {
    const r = await check('jane@blocked.io');
    expect(r).toMatchObject({ accept: false, score: 0, result: 'undeliverable', traits: { domain_category: 'blocked' } });
    expect(codes(r)).toEqual(['spam_domain']);
    expect(codes(await check('x@mail.blocked.io'))).toEqual(['spam_domain']);
  });

  it('marks free providers as a trait only', async () => {
    const r = await check('jane.smith@gmail.com');
    expect(r).toMatchObject({ accept: true, score: 80, issues: [], traits: { free_provider: true, domain_category: 'free' } });
  });

  it.each([
    'abc123@privaterelay.appleid.com',
    'x7y8@mozmail.com',
    'quiet@duck.com',
    'alias@simplelogin.com',
    'shop@jane.anonaddy.com',
    'shop@addy.io',
  ])('accepts the privacy alias %s with warning privacy_alias', async (email) => {
    const r = await check(email);
    expect(r).toMatchObject({ accept: true, result: 'risky', score: 80, traits: { privacy_alias: true, disposable: false, domain_category: 'privacy' } });
    expect(r.issues).toEqual([{ code: 'privacy_alias', message: expect.any(String), severity: 'warning', retryable: false }]);
  });

  it('warns suspicious_domain on an abused TLD without rejecting', async () => {
    const r = await check('winner@promo.tk');
    expect(r).toMatchObject({ accept: true, result: 'risky', score: 80, traits: { suspicious_domain: true } });
    expect(codes(r)).toEqual(['suspicious_domain']);
  });

  it('warns suspicious_domain when several addresses of the domain bounced (recurring)', async () => {
    for (const who of ['a', 'b', 'c']) await recordHardBounce(em(), `${who}@bouncy.io`);
    const r = await check('newcomer@bouncy.io');
    expect(r).toMatchObject({ accept: true, score: 80, traits: { suspicious_domain: true } });
    expect(codes(r)).toEqual(['suspicious_domain']);
  });

  it('takes 10 off a role mailbox (rule 6)', async () => {
    const r = await check('info@acme.io');
    expect(r).toMatchObject({ accept: true, result: 'risky', score: 70, traits: { role_based: true } });
    expect(r.issues).toEqual([{ code: 'role_based', message: expect.any(String), severity: 'warning', retryable: false }]);
    expect((await check('support+eu@acme.io')).score).toBe(70);
  });

  it.each(['spamtrap@acme.io', 'qwerty77@acme.io', 'j12345678@acme.io', 'zzzzzz@acme.io', 'xkcdqwrtplm@acme.io'])(
    'takes 30 off the spam-like mailbox %s (rule 6)',
    async (email) => {
      const r = await check(email);
      expect(r).toMatchObject({ accept: true, result: 'risky', score: 50 });
      expect(codes(r)).toEqual(['spam_like']);
    },
  );

  it('adds the reductions up', async () => {
    const r = await check('info@gamil.com');
    expect(r.score).toBe(80 - 35 - 10);
    expect(codes(r)).toEqual(['domain_typo', 'role_based']);
  });

  it.each([
    ['jane@example.com', 'reserved'],
    ['jane@shop.example.org', 'reserved'],
    ['jane@acme.test', 'reserved'],
    ['jane@host.invalid', 'reserved'],
    ['test@acme.io', 'business'],
    ['asdf@gmail.com', 'free'],
  ])('rejects the test address %s with test_email', async (email, category) => {
    const r = await check(email);
    expect(r).toMatchObject({ accept: false, result: 'undeliverable', score: 0, traits: { domain_category: category } });
    expect(codes(r)[0]).toBe('test_email');
  });

  it.each([
    ['prof@state.edu', 'education'],
    ['x@ox.ac.uk', 'education'],
    ['clerk@city.gov', 'government'],
  ])('categorizes %s as %s', async (email, category) => {
    expect((await check(email)).traits.domain_category).toBe(category);
  });
});

describe('domain typos (rule 6)', () => {
  it('suggests the whole corrected address and takes 35 off', async () => {
    const r = await check('jane@gamil.com');
    expect(r).toMatchObject({ suggestion: 'jane@gmail.com', accept: true, result: 'risky', score: 45 });
    expect(r.issues).toEqual([{ code: 'domain_typo', message: expect.stringContaining('gmail.com'), severity: 'warning', retryable: false }]);
    expect((await check('bob@outlok.com')).suggestion).toBe('bob@outlook.com');
  });

  it('still suggests on a typo domain that the disposable list holds (typo-squatters)', async () => {
    const r = await check('jane@gmial.com');
    expect(r).toMatchObject({ suggestion: 'jane@gmail.com', accept: false, score: 10 });
    expect(codes(r)).toEqual(['disposable_email', 'domain_typo']);
  });

  it('suggests even when the typo domain does not exist, with invalid_domain first', async () => {
    const r = await check('jane@gmail.con');
    expect(r.suggestion).toBe('jane@gmail.com');
    expect(codes(r)).toEqual(['invalid_domain', 'domain_typo']);
    expect(r).toMatchObject({ accept: false, score: 0, result: 'undeliverable' });
  });

  it('never suggests the address itself nor a near miss of a real business domain', async () => {
    expect((await check('jane@gmail.com')).suggestion).toBeNull();
    for (const d of ['gmail.com', 'acme.com', 'mc.com', 'hotmail.com', 'yahoo.com']) expect(suggestDomain(d)).not.toBe(d);
    expect(suggestDomain('acme.com')).toBeNull();
    expect(suggestDomain('mc.com')).toBeNull();
    expect(suggestDomain('yaho.com')).toBe('yahoo.com');
    expect(suggestDomain('outlok.com')).toBe('outlook.com');
  });
});

describe('DNS routing (rule 1)', () => {
  it('accepts a domain whose MX exchange has only AAAA', async () => {
    expect(await check('jane@v6.io')).toMatchObject({ result: 'risky', score: 80, issues: [] });
  });

  it('accepts a domain whose fourth MX exchange is the first with an address', async () => {
    expect(await check('jane@mx4.io')).toMatchObject({ result: 'risky', score: 80, issues: [] });
  });

  it('accepts an implicit MX (A or AAAA record, no MX)', async () => {
    expect(await check('jane@implicit.io')).toMatchObject({ result: 'risky', accept: true, score: 80, issues: [] });
    expect(await check('jane@implicit6.io')).toMatchObject({ result: 'risky', accept: true, score: 80, issues: [] });
  });

  it.each([
    ['a null MX (RFC 7505)', 'jane@nullmx.io', /null MX/],
    ['NXDOMAIN', 'jane@nowhere-at-all.io', /does not exist/],
    ['no MX, A or AAAA', 'jane@noroute.io', /no mail destination/],
    ['an MX whose exchange does not resolve', 'jane@deadmx.io', /no mail destination \(none of its MX hosts has an address\)/],
  ])('rejects %s with invalid_domain, score 0', async (_l, email, message) => {
    const r = await check(email);
    expect(r).toMatchObject({ result: 'undeliverable', accept: false, score: 0, status: 'completed' });
    expect(r.issues).toEqual([{ code: 'invalid_domain', message: expect.stringMatching(message), severity: 'error', retryable: false }]);
  });

  it('answers a temporary failure with unknown, 30, accept, mailbox_unknown retryable, retry_at, not cached', async () => {
    const before = Date.now();
    const r = await check('jane@flaky.io');
    expect(r).toMatchObject({ result: 'unknown', accept: true, score: 30, status: 'completed', cache_hit: false });
    expect(r.issues).toEqual([{ code: 'mailbox_unknown', message: expect.any(String), severity: 'warning', retryable: true }]);
    expect(Date.parse(r.retry_at!)).toBeGreaterThan(before);
    expect(await ctx.services.redis.exists(`${ctx.env.config.redisPrefix}:verify:route:flaky.io`)).toBe(0);
    const again = await check('jane@flaky.io');
    expect(again.cache_hit).toBe(false);
    // Once the domain answers, the next check sees it.
    expect((await check('jane@recovering.io')).score).toBe(30);
    dns.set('recovering.io', { mx: [{ priority: 10, exchange: 'mx.acme.io' }] });
    expect(await check('jane@recovering.io')).toMatchObject({ result: 'risky', score: 80, issues: [] });
  });
});

describe('routing cache (rule 9)', () => {
  const key = (d: string) => `${ctx.env.config.redisPrefix}:verify:route:${d}`;

  it('serves a repeated domain from the cache (cache_hit) for every organization, 12 hours', async () => {
    const first = await check('a@fresh.io');
    expect(first.cache_hit).toBe(false);
    const other = await createOrg(ctx.services, { name: 'Other' });
    dns.resetCounts();
    const second = await check('b@fresh.io', other.token);
    expect(second).toMatchObject({ cache_hit: true, score: 80, issues: [] });
    expect(dns.count('fresh.io')).toBe(0);
    const ttl = await ctx.services.redis.ttl(key('fresh.io'));
    expect(ttl).toBeGreaterThan(12 * 3600 - 10);
    expect(ttl).toBeLessThanOrEqual(12 * 3600);
  });

  it('keeps pinned consumer providers 7 days', async () => {
    await check('someone@outlook.com');
    const ttl = await ctx.services.redis.ttl(key('outlook.com'));
    expect(ttl).toBeGreaterThan(7 * 24 * 3600 - 10);
  });

  it('caches a definitive negative answer an hour', async () => {
    await check('x@noroute.io');
    const r = await check('y@noroute.io');
    expect(r).toMatchObject({ cache_hit: true });
    expect(codes(r)).toEqual(['invalid_domain']);
    expect(await ctx.services.redis.ttl(key('noroute.io'))).toBeLessThanOrEqual(3600);
  });
});

describe('trusted history', () => {
  it('rejects a hard-bounced address with previously_bounced, score 0', async () => {
    await recordHardBounce(em(), 'Gone@Acme.io');
    const r = await check('gone@acme.io');
    expect(r).toMatchObject({ result: 'undeliverable', accept: false, score: 0 });
    expect(codes(r)).toEqual(['previously_bounced']);
  });

  it('rejects a complained address with previously_complained, score 5, before globally_suppressed', async () => {
    await recordComplaint(em(), 'angry@acme.io');
    await recordSuppression(em(), 'angry@acme.io');
    const r = await check('angry@acme.io');
    expect(r).toMatchObject({ accept: false, score: 5, result: 'undeliverable' });
    expect(codes(r)).toEqual(['previously_complained', 'globally_suppressed']);
  });

  it('rejects a globally suppressed address', async () => {
    await recordSuppression(em(), 'quiet@acme.io');
    const r = await check('quiet@acme.io');
    expect(codes(r)).toEqual(['globally_suppressed']);
    expect(r.score).toBe(0);
    await recordSuppression(em(), 'quiet@acme.io', false);
    expect((await check('quiet@acme.io')).issues).toEqual([]);
  });

  it('rejects mailbox_not_found', async () => {
    await recordMailboxNotFound(em(), 'nobody-here@acme.io');
    const r = await check('nobody-here@acme.io');
    expect(codes(r)).toEqual(['mailbox_not_found']);
    expect(r).toMatchObject({ score: 0, accept: false });
  });

  it('answers a recently full mailbox with mailbox_full, score 15, retryable, retry_at', async () => {
    const at = new Date(Date.now() - 3600_000);
    await recordMailboxFull(em(), 'full@acme.io', at);
    const r = await check('full@acme.io');
    expect(r).toMatchObject({ result: 'undeliverable', accept: false, score: 15 });
    expect(r.issues).toEqual([{ code: 'mailbox_full', message: expect.any(String), severity: 'error', retryable: true }]);
    expect(r.retry_at).toBe(new Date(at.getTime() + 72 * 3600_000).toISOString());
    await recordMailboxFull(em(), 'wasfull@acme.io', new Date(Date.now() - 4 * 24 * 3600_000));
    expect((await check('wasfull@acme.io')).issues).toEqual([]);
  });

  it('answers deliverable, score >= 90, only for a mailbox proven by the provider\'s delivery', async () => {
    await recordProven(em(), 'reader@acme.io');
    expect(await check('reader@acme.io')).toMatchObject({ result: 'deliverable', accept: true, score: 100, issues: [] });
    await recordProven(em(), 'sales@acme.io');
    expect(await check('sales@acme.io')).toMatchObject({ result: 'deliverable', score: 90 });
    await recordProven(em(), 'xqzvbnmtk@acme.io');
    expect(await check('xqzvbnmtk@acme.io')).toMatchObject({ result: 'risky', score: 70 });
  });

  it('lets a later proof outweigh an older bounce, never a complaint', async () => {
    await recordHardBounce(em(), 'back@acme.io', new Date(Date.now() - 86400_000));
    await recordProven(em(), 'back@acme.io');
    expect((await check('back@acme.io')).result).toBe('deliverable');
    await recordComplaint(em(), 'back@acme.io');
    expect(codes(await check('back@acme.io'))).toEqual(['previously_complained']);
  });

  it('warns catch_all on a domain recorded as accepting any mailbox', async () => {
    await recordCatchAllDomain(em(), 'catchall.io');
    const r = await check('anyone@catchall.io');
    expect(r).toMatchObject({ accept: true, result: 'risky', score: 80 });
    expect(r.issues).toEqual([{ code: 'catch_all', message: expect.any(String), severity: 'warning', retryable: false }]);
  });
});

describe('internal_error', () => {
  it('reports a broken check as internal_error, failed, score null, keeping the other findings', async () => {
    const original = ctx.services.dns;
    ctx.services.dns = Object.assign(Object.create(original) as DnsService, {
      mx: async () => {
        throw new Error('resolver bug');
      },
    });
    try {
      const r = await check('info@gmaill.com');
      expect(r).toMatchObject({ status: 'failed', score: null, result: 'unknown', suggestion: 'info@gmail.com', traits: { role_based: true } });
      expect(r.issues[0]).toEqual({ code: 'internal_error', message: expect.any(String), severity: 'error', retryable: true });
      expect(codes(r)).toEqual(['internal_error', 'domain_typo', 'role_based']);
      expect(r.retry_at).not.toBeNull();
      expect(r.quota.used).toBeGreaterThan(0);
    } finally {
      ctx.services.dns = original;
    }
  });
});

describe('quota (rule 10, docs/verification.md "Quota")', () => {
  it('counts every call for the UTC month and reports resets_at', async () => {
    const org = await createOrg(ctx.services, { name: 'Q', verifyQuota: 3 });
    const now = new Date();
    const resets = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1)).toISOString();
    const a = await check('a@quota.io', org.token);
    expect(a.quota).toEqual({ limit: 3, used: 1, remaining: 2, resets_at: resets });
    const b = await check('not-an-address', org.token);
    expect(b.quota.used).toBe(2);
    await check('c@quota.io', org.token);
    dns.resetCounts();
    const skipped = await check('info@gamil.com', org.token);
    expect(skipped).toMatchObject({ status: 'skipped', score: null, accept: true, result: 'unknown', cache_hit: false, suggestion: 'info@gmail.com' });
    expect(skipped.quota).toEqual({ limit: 3, used: 3, remaining: 0, resets_at: resets });
    expect(skipped.issues[0]).toEqual({ code: 'quota_exceeded', message: expect.any(String), severity: 'error', retryable: true });
    expect(skipped.retry_at).toBe(resets);
    expect(dns.count()).toBe(0);
    // Local checks still run; history does not.
    await recordHardBounce(em(), 'gone2@quota.io');
    const local = await check('jane@mailinator.com', org.token);
    expect(local).toMatchObject({ status: 'skipped', accept: false, score: null, result: 'undeliverable' });
    expect(codes(local)).toEqual(['quota_exceeded', 'disposable_email']);
    expect(codes(await check('gone2@quota.io', org.token))).toEqual(['quota_exceeded']);
  });

  it('starts again in the next UTC month', async () => {
    const org = await createOrg(ctx.services, { name: 'Month', verifyQuota: 1 });
    const realClock = ctx.services.clock;
    try {
      ctx.services.clock = () => new Date('2026-01-31T23:59:59.000Z');
      expect((await check('a@quota.io', org.token)).quota).toMatchObject({ used: 1, resets_at: '2026-02-01T00:00:00.000Z' });
      expect((await check('a@quota.io', org.token)).status).toBe('skipped');
      ctx.services.clock = () => new Date('2026-02-01T00:00:00.000Z');
      expect((await check('a@quota.io', org.token))).toMatchObject({ status: 'completed', quota: { used: 1, resets_at: '2026-03-01T00:00:00.000Z' } });
    } finally {
      ctx.services.clock = realClock;
    }
  });

  it('follows a limit changed by `cli org update --verify-quota` at once', async () => {
    const org = await createOrg(ctx.services, { name: 'Raise', verifyQuota: 1 });
    await check('a@quota.io', org.token);
    expect((await check('a@quota.io', org.token)).status).toBe('skipped');
    await updateOrganization(em(), org.organizationId, { verifyQuota: 3 });
    expect(await check('a@quota.io', org.token)).toMatchObject({ status: 'completed', quota: { limit: 3, used: 2, remaining: 1 } });
    await updateOrganization(em(), org.organizationId, { verifyQuota: 1 });
    expect(await check('a@quota.io', org.token)).toMatchObject({ status: 'skipped', quota: { limit: 1, used: 1, remaining: 0 } });
  });

  it('skips everything with a quota of 0', async () => {
    const org = await createOrg(ctx.services, { name: 'Zero', verifyQuota: 0 });
    const r = await check('jane@acme.io', org.token);
    expect(r).toMatchObject({ status: 'skipped', accept: true, quota: { limit: 0, used: 0, remaining: 0 } });
  });

  it('never overruns under concurrent calls: quota 10, 50 parallel calls, exactly 10 completed', async () => {
    const org = await createOrg(ctx.services, { name: 'Race', verifyQuota: 10 });
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) => check(`user${i}@quota.io`, org.token)));
    expect(results.filter((r) => r.status === 'completed')).toHaveLength(10);
    expect(results.filter((r) => r.status === 'skipped')).toHaveLength(40);
    expect(Math.max(...results.map((r) => r.quota.used))).toBe(10);
    const rows = await em().getConnection().execute('select used from verification_quotas where organization_id = ?', [org.organizationId]);
    expect(rows).toEqual([{ used: 10 }]);
  });
});

describe('quota across processes', () => {
  it('never overruns when several processes (stores) consume at once', async () => {
    const org = await createOrg(ctx.services, { name: 'Multi', verifyQuota: 25 });
    const stores = Array.from({ length: 4 }, () => VerificationStore.forEntityManager(ctx.services.orm.em.fork()));
    const results = await Promise.all(
      Array.from({ length: 100 }, (_, i) => stores[i % stores.length]!.begin({ organizationId: org.organizationId, month: '2026-11-01', email: null, domain: null }).then((r) => r.quota)),
    );
    expect(results.filter((r) => r.consumed)).toHaveLength(25);
    const granted = results.filter((r) => r.consumed).map((r) => r.used).sort((a, b) => a - b);
    expect(granted).toEqual(Array.from({ length: 25 }, (_, i) => i + 1));
    expect(results.every((r) => r.used <= 25 && r.limit === 25)).toBe(true);
  });
});

describe('the code table (rules 5, 7, 8; docs/verification.md)', () => {
  it('is retryable exactly for mailbox_full, mailbox_unknown, quota_exceeded, internal_error', () => {
    const retryable = Object.entries(ISSUE_CODES).filter(([, r]) => r.retryable).map(([c]) => c).sort();
    expect(retryable).toEqual(['internal_error', 'mailbox_full', 'mailbox_unknown', 'quota_exceeded']);
  });

  it('has the severities of docs/verification.md "Issue codes" and every code of rule 8', () => {
    const warnings = Object.entries(ISSUE_CODES).filter(([, r]) => r.severity === 'warning').map(([c]) => c).sort();
    expect(warnings).toEqual(['catch_all', 'domain_typo', 'mailbox_unknown', 'privacy_alias', 'role_based', 'spam_like', 'suspicious_domain']);
    expect(Object.keys(ISSUE_CODES).sort()).toEqual(
      [
        'invalid_format', 'disposable_email', 'spam_domain', 'invalid_domain', 'test_email', 'mailbox_not_found', 'mailbox_full',
        'mailbox_unknown', 'previously_bounced', 'previously_complained', 'globally_suppressed', 'quota_exceeded', 'internal_error',
        'domain_typo', 'role_based', 'spam_like', 'privacy_alias', 'suspicious_domain', 'catch_all',
      ].sort(),
    );
  });
});

describe('cli verify EMAIL (docs/verification.md)', () => {
  it('verifies through the API with MAILROOM_URL and MAILROOM_TOKEN', async () => {
    const address = await ctx.app.listen({ port: 0, host: '127.0.0.1' });
    const run = (args: string[], extra: Record<string, string> = {}) => runCli(args, { ...ctx.env.env, MAILROOM_URL: address, MAILROOM_TOKEN: token, ...extra });
    const json = await run(['verify', 'info@gamil.com', '--json']);
    expect(json.code).toBe(0);
    expect(JSON.parse(json.stdout)).toMatchObject({ object: 'email_verification', suggestion: 'info@gmail.com', score: 35 });
    const text = await run(['verify', 'jane@acme.io']);
    expect(text.stdout).toContain('jane@acme.io: risky, accepted, score 80');
    expect(await run(['verify', 'jane@acme.io'], { MAILROOM_TOKEN: `svc_${'0'.repeat(64)}` })).toMatchObject({
      code: 1,
      stderr: expect.stringContaining('missing_api_key'),
    });
  });
});

describe('docs/verification.md', () => {
  it('every example address of the code table produces its code', async () => {
    const hourAgo = new Date(Date.now() - 3600_000);
    await recordComplaint(em(), 'angry@acme.io');
    await recordHardBounce(em(), 'gone@acme.io');
    await recordSuppression(em(), 'quiet@acme.io');
    await recordMailboxNotFound(em(), 'nobody-here@acme.io');
    await recordMailboxFull(em(), 'full@acme.io', hourAgo);
    for (const who of ['a', 'b', 'c']) await recordHardBounce(em(), `${who}@bouncy.io`);
    await recordCatchAllDomain(em(), 'catchall.io');
    const doc = readFileSync('docs/verification.md', 'utf8');
    const rows = doc.split('\n').filter((l) => (/^\| `([a-z_]+)` \|/.exec(l)?.[1] ?? '') in ISSUE_CODES);
    expect(rows).toHaveLength(Object.keys(ISSUE_CODES).length);
    let checked = 0;
    for (const row of rows) {
      const cells = row.split(' | ');
      const code = /`([a-z_]+)`/.exec(cells[0]!)![1] as IssueCode;
      const rule = ISSUE_CODES[code];
      expect(cells[1]).toContain(rule.severity);
      expect(cells[3]!.startsWith(rule.retryable ? 'yes' : 'no')).toBe(true);
      for (const piece of cells[4]!.split(/[,;] /)) {
        const address = /`([^`]+@[^`]+)`/.exec(piece)?.[1];
        if (!address) continue;
        const r = await check(address);
        expect(codes(r), `${address} should give ${code}`).toContain(code);
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(25);
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

// docs/security.md "Threat model": one organization's token never reads or changes another's resource.
let ctx: TestContext;
let acme: { organizationId: string; token: string };
let globex: { organizationId: string; token: string };

beforeAll(async () => {
  ctx = await createTestContext();
  acme = await createOrg(ctx.services, { name: 'Acme' });
  globex = await createOrg(ctx.services, { name: 'Globex' });
});
afterAll(async () => ctx?.close());

function mint(token: string, body: object) {
  return ctx.app.inject({ method: 'POST', url: '/api/v2/tokens', headers: bearer(token), payload: body });
}

async function names(token: string): Promise<Array<{ id: string; name: string }>> {
  return (await ctx.app.inject({ url: '/api/v2/tokens?limit=100', headers: bearer(token) })).json().data;
}

describe('tokens across organizations', () => {
  it('reuseIfExists only finds a token of the caller\'s own organization', async () => {
    const acmeCi = (await mint(acme.token, { name: 'ci', preset: 'app' })).json();
    const globexCi = (await mint(globex.token, { name: 'ci', preset: 'app' })).json();
    expect(globexCi.reused).toBe(false);
    expect(globexCi.id).not.toBe(acmeCi.id);
    expect(globexCi.token).not.toBe(acmeCi.token);

    // Both organizations have a first token named "default": each gets its own back.
    const acmeDefault = (await mint(acme.token, { name: 'default' })).json();
    const globexDefault = (await mint(globex.token, { name: 'default' })).json();
    expect(acmeDefault).toMatchObject({ reused: true, token: acme.token });
    expect(globexDefault).toMatchObject({ reused: true, token: globex.token });
  });

  it('a token minted by one organization acts for that organization only', async () => {
    const child = (await mint(globex.token, { name: 'child', permissions: ['tokens'] })).json().token;
    const seen = await names(child);
    const acmeIds = new Set((await names(acme.token)).map((t) => t.id));
    expect(seen.map((t) => t.name)).toContain('child');
    expect(seen.some((t) => acmeIds.has(t.id))).toBe(false);

    const grandchild = (await mint(child, { name: 'grandchild' })).json();
    expect((await names(globex.token)).map((t) => t.id)).toContain(grandchild.id);
    expect(acmeIds.has(grandchild.id)).toBe(false);
    expect((await names(acme.token)).map((t) => t.id)).not.toContain(grandchild.id);
  });

  it('lists never show another organization\'s tokens, even by name', async () => {
    await mint(acme.token, { name: 'acme only' });
    expect((await names(globex.token)).map((t) => t.name)).not.toContain('acme only');
  });
});

describe('every path that names a resource, across organizations', () => {
  async function as(token: string, method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, payload?: object) {
    return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(token), ...(payload ? { payload } : {}) });
  }

  it("answers 404 not_found to another organization's ids, addresses, hostnames and names, and changes nothing", async () => {
    const created = async (method: 'POST', url: string, payload: object) => {
      const res = await as(acme.token, method, url, payload);
      expect(res.statusCode).toBe(200);
      return res.json();
    };
    const domain = await created('POST', '/domains', { domain: 'acme-owned.example' });
    const sender = await created('POST', '/senders', { name: 'News', email: 'news@acme-owned.example' });
    const subscriber = await created('POST', '/subscribers', { email: 'only-acme@example.com', tags: ['acme-tag'] });
    const tag = subscriber.tags?.[0] ?? (await as(acme.token, 'GET', '/tags/acme-tag')).json();
    const campaign = await created('POST', '/campaigns', {
      name: 'Acme news',
      subject: 's',
      senderId: sender.id,
      content: 'Hi\n\n[Unsubscribe]({{unsubscribe_url}})',
    });
    const email = await created('POST', '/emails', { from: 'news@acme-owned.example', to: 'x@example.com', subject: 's', markdown: 'm' });

    const attempts: Array<['GET' | 'POST' | 'PATCH' | 'DELETE', string, object?]> = [
      ['GET', `/domains/${domain.id}`],
      ['GET', `/domains/${domain.domain}`],
      ['POST', `/domains/${domain.id}/verify`],
      ['DELETE', `/domains/${domain.domain}`],
      ['GET', `/senders/${sender.id}`],
      ['GET', `/subscribers/${subscriber.id}`],
      ['GET', `/subscribers/${encodeURIComponent(subscriber.email)}`],
      ['PATCH', `/subscribers/${subscriber.id}`, { name: 'stolen' }],
      ['POST', `/subscribers/${subscriber.id}/unsubscribe`, {}],
      ['POST', `/subscribers/${subscriber.id}/tags`, { tags: ['x'] }],
      ['DELETE', `/subscribers/${subscriber.id}/tags`, { tags: ['acme-tag'] }],
      ['GET', `/subscribers/${subscriber.id}/events`],
      ['GET', `/tags/${tag.id}`],
      ['PATCH', `/tags/${tag.id}`, { name: 'stolen' }],
      ['GET', `/campaigns/${campaign.id}`],
      ['PATCH', `/campaigns/${campaign.id}`, { name: 'stolen' }],
      ['POST', `/campaigns/${campaign.id}/send`, {}],
      ['POST', `/campaigns/${campaign.id}/test`, { to: 'spy@example.com' }],
      ['DELETE', `/campaigns/${campaign.id}`],
      ['GET', `/emails/${email.id}`],
      ['POST', '/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: subscriber.id, data: { amount: 100 } }],
      ['POST', '/events', { eventType: 'SUBSCRIBER_PAYMENT', subscriber: subscriber.email, data: { amount: 100 } }],
    ];
    for (const [method, url, payload] of attempts) {
      const res = await as(globex.token, method, url, payload);
      expect({ method, url, status: res.statusCode, name: res.json().name }).toEqual({ method, url, status: 404, name: 'not_found' });
    }
    // Cursors of another organization are unknown too (docs/emails.md).
    expect((await as(globex.token, 'GET', `/emails?after=${email.id}`)).statusCode).toBe(422);
    expect((await as(globex.token, 'GET', `/campaigns?after=${campaign.id}`)).statusCode).toBe(422);

    // Everything is as Acme left it.
    expect((await as(acme.token, 'GET', `/domains/${domain.id}`)).json().status).toBe('NOT_STARTED');
    const after = (await as(acme.token, 'GET', `/subscribers/${subscriber.id}`)).json();
    expect(after).toMatchObject({ status: subscriber.status, revenue: 0, tags: [{ name: 'acme-tag' }] });
    expect(after.name ?? null).toBe(subscriber.name ?? null);
    expect((await as(acme.token, 'GET', `/tags/${tag.id}`)).json().name).toBe('acme-tag');
    expect((await as(acme.token, 'GET', `/campaigns/${campaign.id}`)).json()).toMatchObject({ name: 'Acme news', status: 'DRAFT' });
    const emails = await ctx.services.orm.em.fork().getConnection().execute(`select count(*)::int as n from emails where organization_id = ?`, [globex.organizationId]);
    expect(emails[0].n).toBe(0);
  });
});

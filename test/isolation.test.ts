import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

// Contract 15: one organization's token never reads or changes another's resource.
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

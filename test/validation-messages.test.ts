import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

const post = (url: string, payload: unknown) => ctx.app.inject({ method: 'POST', url: `/api/v2${url}`, headers: bearer(token), payload: payload as object });
const count = async (table: string) => Number((await ctx.services.orm.em.fork().execute<Array<{ n: string }>>(`select count(*) as n from ${table}`))[0]!.n);

describe('validation messages a person understands', () => {
  it('names the field and says what was wrong with it', async () => {
    const two = await post('/emails', { from: 'a@acme.test', to: ['x@example.com', 'y@example.com'], subject: 'Hi', html: '<p>x</p>' });
    expect(two.statusCode).toBe(422);
    expect(two.json().message).toMatch(/^to: must be a single address, got 2/);

    const missing = await post('/emails', { to: 'x@example.com', html: '<p>x</p>' });
    expect(missing.json().details).toEqual(expect.arrayContaining([{ path: 'from', message: 'is required' }, { path: 'subject', message: 'is required' }]));

    const wrongType = await post('/tags', { name: 42 });
    expect(wrongType.statusCode).toBe(422);
    expect(wrongType.json().message).toBe('name: must be a string, got a whole number');
    for (const res of [two, missing, wrongType]) expect(res.json().message).not.toMatch(/Invalid input/);
    // A union names what its members accept (docs/foundation.md "Validation").
    const union = await post('/emails', { from: 'a@acme.test', to: 42, subject: 'Hi', html: '<p>x</p>' });
    expect(union.statusCode).toBe(422);
    expect(union.json().message).toMatch(/^to: must be a string or a list, got a whole number/);
    // A query parameter is text: a whole number is written in digits (not hex, binary, an
    // exponent or nothing, which Number() would read as 16, 3, 10 and 0).
    for (const value of ['abc', '0x10', '0b11', '1e1', '', '-1', '1.5', ' 5']) {
      const limit = await ctx.app.inject({ method: 'GET', url: `/api/v2/emails?limit=${encodeURIComponent(value)}`, headers: bearer(token) });
      expect({ value, status: limit.statusCode }).toEqual({ value, status: 422 });
      expect(limit.json()).toMatchObject({ message: 'limit: must be a whole number written in digits', details: [{ path: 'limit' }] });
    }
    // Past 2^53: the parameter's own bound, once.
    const huge = await ctx.app.inject({ method: 'GET', url: '/api/v2/tokens?limit=99999999999999999999', headers: bearer(token) });
    expect(huge.json()).toMatchObject({ message: 'limit: must be at most 100', details: [{ path: 'limit', message: 'must be at most 100' }] });
    expect(huge.json().details).toHaveLength(1);
    // A parameter given twice is said to be given twice.
    const twice = await ctx.app.inject({ method: 'GET', url: '/api/v2/tokens?limit=1&limit=2', headers: bearer(token) });
    expect(twice.statusCode).toBe(422);
    expect(twice.json().message).toBe('limit: is given more than once');
    expect((await ctx.app.inject({ method: 'GET', url: '/api/v2/emails?after=a&after=b', headers: bearer(token) })).json().message).toBe('after: is given more than once');
    const infinite = await ctx.app.inject({ method: 'GET', url: '/api/v2/emails?limit=Infinity', headers: bearer(token) });
    expect(infinite.json().message).toBe('limit: must be a whole number written in digits');
  });

  it('names the values an enum takes, in words', async () => {
    const preset = await post('/tokens', { name: 'x', preset: 'bogus' });
    expect(preset.statusCode).toBe(422);
    expect(preset.json().message).toMatch(/^preset: must be one of "[a-z]+"(, "[a-z]+")* or "[a-z]+", got "bogus"$/);
    const v1 = await ctx.app.inject({ method: 'POST', url: '/api/v1/emails', headers: bearer(token), payload: { from: 'a@acme.test', to: 'b@example.com', subject: 'v', content: 'x', contentType: 'html' } });
    expect(v1.json().error.message).toBe('contentType: must be one of "MARKDOWN", "HTML" or "TIPTAP", got "html"');
    for (const res of [preset, v1]) expect(res.body).not.toMatch(/Invalid option/);
  });

  it('says the bounds of a number, a text and a list in words, not in zod\'s notation', async () => {
    const get = (url: string) => ctx.app.inject({ url: `/api/v2${url}`, headers: bearer(token) });
    expect((await get('/emails?limit=0')).json().message).toBe('limit: must be at least 1');
    expect((await get('/emails?limit=101')).json().message).toBe('limit: must be at most 100');
    const subscriber = await post('/subscribers', { email: 'bounds@example.com', fields: null });
    expect(subscriber.json().message).toBe('fields: must be an object, got null');
    const empty = await post('/emails', { from: 'a@acme.test', to: 'x@example.com', subject: 'Hi', html: '' });
    expect(empty.json().message).not.toMatch(/Too small|expected string to have/);
    for (const res of [subscriber, empty]) expect(res.statusCode).toBe(422);
  });
});

describe('unknown body fields: refused on every route, the same way', () => {
  const cases: Array<[string, string, unknown]> = [
    ['POST', '/emails', { from: 'a@acme.test', to: 'x@example.com', subject: 'Hi', html: '<p>x</p>', colour: 'red' }],
    ['POST', '/tokens', { name: 'ci', colour: 'red' }],
    ['POST', '/tags', { name: 'vip', colour: 'red' }],
    ['POST', '/subscribers', { email: 'new@example.com', colour: 'red' }],
    ['POST', '/domains', { domain: 'acme-unknown.test', colour: 'red' }],
    ['POST', '/verify', { email: 'x@example.com', colour: 'red' }],
    ['POST', '/campaigns', { name: 'Launch', colour: 'red' }],
    // A body that may be absent (`.nullish()`): still strict when there is one.
    ['POST', '/subscribers/bounds@example.com/unsubscribe', { colour: 'red' }],
  ];
  it.each(cases)('%s %s with an unknown field is 422 naming it, and creates nothing', async (method, url, payload) => {
    const before = await Promise.all(['emails', 'api_tokens', 'tags', 'subscribers', 'domains', 'campaigns'].map(count));
    const res = await ctx.app.inject({ method: method as 'POST', url: `/api/v2${url}`, headers: bearer(token), payload: payload as object });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(res.json().message).toContain('"colour" is not a field of this request');
    expect(res.json().details).toEqual([{ path: 'colour', message: '"colour" is not a field of this request (check its spelling)' }]);
    expect(await Promise.all(['emails', 'api_tokens', 'tags', 'subscribers', 'domains', 'campaigns'].map(count))).toEqual(before);
  });

  it('names an unknown field of a batch by its own path, one detail per field', async () => {
    const email = { from: 'a@acme.test', to: 'b@example.com', subject: 'Hi', html: '<p>x</p>' };
    const res = await ctx.app.inject({ method: 'POST', url: '/api/v2/emails/batch', headers: bearer(token), payload: [email, { ...email, colour: 'red', size: 2 }] });
    expect(res.statusCode).toBe(422);
    expect(res.json().details).toEqual([
      { path: '1.colour', message: '"colour" is not a field of this request (check its spelling)' },
      { path: '1.size', message: '"size" is not a field of this request (check its spelling)' },
    ]);
  });

  it('PATCH routes refuse them too (docs/foundation.md: every route but PATCH /campaigns), changing nothing', async () => {
    const tag = (await post('/tags', { name: 'patch-me' })).json();
    const renamed = await ctx.app.inject({ method: 'PATCH', url: `/api/v2/tags/${tag.id}`, headers: bearer(token), payload: { name: 'renamed', colour: 'red' } });
    expect(renamed.statusCode).toBe(422);
    expect(renamed.json()).toMatchObject({ name: 'validation_error', statusCode: 422 });
    expect(renamed.json().message).toContain('"colour" is not a field of this request');
    expect((await ctx.app.inject({ url: `/api/v2/tags/${tag.id}`, headers: bearer(token) })).json().name).toBe('patch-me');

    const subscriber = (await post('/subscribers', { email: 'patch-me@example.com' })).json();
    const patched = await ctx.app.inject({ method: 'PATCH', url: `/api/v2/subscribers/${subscriber.id}`, headers: bearer(token), payload: { colour: 'red' } });
    expect(patched.statusCode).toBe(422);
    expect(patched.json().message).toContain('"colour" is not a field of this request');
  });

  it('PATCH /campaigns/{id} is the spec\'s exception: it ignores them and says so in warnings', async () => {
    const created = (await post('/campaigns', { name: 'Draft' })).json();
    const res = await ctx.app.inject({ method: 'PATCH', url: `/api/v2/campaigns/${created.id}`, headers: bearer(token), payload: { subject: 'New', colour: 'red' } });
    expect(res.statusCode).toBe(200);
    expect(res.json().warnings).toEqual(['colour was ignored: not a field of a campaign']);
    expect(res.json().updatedFields).toEqual(['subject']);
  });

  it('mailFormat is always a string (docs/campaigns.md "API decisions")', async () => {
    const created = (await post('/campaigns', { name: 'Formats' })).json();
    expect(created.mailFormat).toBe('html');
    const patched = await ctx.app.inject({ method: 'PATCH', url: `/api/v2/campaigns/${created.id}`, headers: bearer(token), payload: { mailFormat: null } });
    expect(patched.statusCode).toBe(200);
    // null is the default it already has: nothing changed, and updatedFields says so.
    expect(patched.json().updatedFields).toEqual([]);
    const got = (await ctx.app.inject({ url: `/api/v2/campaigns/${created.id}`, headers: bearer(token) })).json();
    expect(got.mailFormat).toBe('html');
    const [row] = await ctx.services.orm.em.fork().execute<{ mail_format: string | null }[]>('select mail_format from campaigns where id = ?', [created.id]);
    expect(row!.mail_format).toBe('html');
  });
});

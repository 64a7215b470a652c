import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitForRedis } from '../src/shared/redis.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  // The producer connection fails fast until it is ready (no offline queue): wait for it.
  await waitForRedis(ctx.services.redis);
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

function api(method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, body?: unknown, as = token) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(as), ...(body === undefined ? {} : { payload: body as object }) });
}

describe('tags (docs/audience.md)', () => {
  it('creates, gets by id or name, and lists by name', async () => {
    const b = (await api('POST', '/tags', { name: ' beta ' })).json();
    expect(b).toEqual({ id: expect.stringMatching(/^tag_[0-9a-z]{26}$/), name: 'beta' });
    const a = (await api('POST', '/tags', { name: 'Alpha' })).json();
    expect((await api('GET', `/tags/${b.id}`)).json()).toEqual(b);
    expect((await api('GET', '/tags/ALPHA')).json()).toEqual(a);
    const listed = (await api('GET', '/tags')).json();
    expect(listed).toEqual({ object: 'list', has_more: false, data: [a, b] });
  });

  it('refuses a name already taken (any case) with 422', async () => {
    await api('POST', '/tags', { name: 'Taken' });
    const res = await api('POST', '/tags', { name: 'taken' });
    expect(res.statusCode).toBe(422);
    expect(res.json()).toMatchObject({ name: 'validation_error', details: [{ path: 'name' }] });
  });

  it('refuses a name in the form of a tag id (the paths read it as an id: it could name another tag), on a tag write and on a subscriber', async () => {
    const other = (await api('POST', '/tags', { name: 'ok' })).json();
    for (const request of [api('POST', '/tags', { name: other.id }), api('PATCH', `/tags/${other.id}`, { name: 'tag_01m987np8h1e6kkpe44kkacw3m' })]) {
      const res = await request;
      expect(res.statusCode).toBe(422);
      expect(res.json()).toMatchObject({ name: 'validation_error', details: [{ path: 'name', message: expect.stringContaining('tag id') }] });
    }
    const subscriber = (await api('POST', '/subscribers', { email: 'id-form@example.com', tags: [other.id, 'tag_like_but_not_an_id'] })).json();
    expect(subscriber.tags.map((t: { name: string }) => t.name)).toEqual(['tag_like_but_not_an_id']);
    expect(subscriber.warnings).toEqual([expect.stringContaining(`tag "${other.id}" was not applied`)]);
    // A tag named so before the rule can still be detached by its name.
    const oldName = 'tag_01m987np8h1e6kkpe44kkacw3z';
    const [legacy] = await ctx.services.orm.em.fork().execute<{ id: string }[]>(
      `insert into tags (id, organization_id, name, created_at, updated_at) select 'tag_01m987np8h1e6kkpe44kkacw40', organization_id, ?, now(), now() from subscribers where id = ? returning id`,
      [oldName, subscriber.id],
    );
    await ctx.services.orm.em.fork().execute('insert into subscriber_tags (subscriber_id, tag_id, created_at) values (?, ?, now())', [subscriber.id, legacy!.id]);
    const detached = (await api('DELETE', `/subscribers/${subscriber.id}/tags`, { tags: [oldName] })).json();
    expect(detached.tags.map((t: { name: string }) => t.name)).toEqual(['tag_like_but_not_an_id']);
  });

  it('renames by id or by current name', async () => {
    const t = (await api('POST', '/tags', { name: 'old name' })).json();
    const byName = await api('PATCH', '/tags/old%20name', { name: 'newer' });
    expect(byName.json()).toEqual({ id: t.id, name: 'newer' });
    const byId = await api('PATCH', `/tags/${t.id}`, { name: 'NEWER' });
    expect(byId.json()).toEqual({ id: t.id, name: 'NEWER' });
    expect((await api('GET', '/tags/old%20name')).statusCode).toBe(404);
  });

  it('accepts triggerWorkflows on a create and a rename (docs/audience.md "Workflows"), and a wrong type is 422', async () => {
    const created = await api('POST', '/tags', { name: 'flows', triggerWorkflows: true });
    expect(created.statusCode, created.body).toBe(200);
    const renamed = await api('PATCH', `/tags/${created.json().id}`, { name: 'flows2', triggerWorkflows: false });
    expect(renamed.json()).toEqual({ id: created.json().id, name: 'flows2' });
    const wrong = await api('POST', '/tags', { name: 'flows3', triggerWorkflows: 'yes' });
    expect(wrong.statusCode).toBe(422);
    expect(wrong.json().details[0].path).toBe('triggerWorkflows');
  });

  it('refuses a rename to a name taken by another tag with 422', async () => {
    await api('POST', '/tags', { name: 'first' });
    const second = (await api('POST', '/tags', { name: 'second' })).json();
    const res = await api('PATCH', `/tags/${second.id}`, { name: 'FIRST' });
    expect(res.statusCode).toBe(422);
    expect((await api('GET', `/tags/${second.id}`)).json().name).toBe('second');
  });

  it.each([
    ['missing name', {}],
    ['empty name', { name: '' }],
    ['blank name', { name: '   ' }],
    ['name over 100 characters', { name: 'x'.repeat(101) }],
    ['name of the wrong type', { name: 7 }],
  ])('refuses %s with 422 on create and rename', async (_label, body) => {
    const t = (await api('POST', '/tags', { name: `valid ${_label}` })).json();
    for (const res of [await api('POST', '/tags', body), await api('PATCH', `/tags/${t.id}`, body)]) {
      expect(res.statusCode).toBe(422);
      expect(res.json().name).toBe('validation_error');
    }
  });

  it('accepts exactly 100 characters', async () => {
    expect((await api('POST', '/tags', { name: 'y'.repeat(100) })).statusCode).toBe(200);
  });

  it('answers 404 for an unknown tag and for another organization', async () => {
    const t = (await api('POST', '/tags', { name: 'private' })).json();
    const other = await createOrg(ctx.services, { name: 'Other' });
    for (const ref of [t.id, 'private']) {
      expect((await api('GET', `/tags/${ref}`, undefined, other.token)).statusCode).toBe(404);
      expect((await api('PATCH', `/tags/${ref}`, { name: 'mine' }, other.token)).statusCode).toBe(404);
    }
    expect((await api('GET', '/tags', undefined, other.token)).json().data).toEqual([]);
    expect((await api('GET', '/tags/nothing')).statusCode).toBe(404);
  });

  it('needs the audience permission', async () => {
    const limited = (await api('POST', '/tokens', { name: 'subs only', permissions: ['subscribers'] })).json().token;
    for (const [method, url] of [['GET', '/tags'], ['POST', '/tags'], ['GET', '/tags/x'], ['PATCH', '/tags/x']] as const) {
      const res = await api(method, url, method === 'GET' ? undefined : { name: 'n' }, limited);
      expect(res.statusCode).toBe(403);
      expect(res.json().name).toBe('missing_permission');
    }
  });
});

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

// An organization deleted by an operator (`delete from organizations`) takes every row of
// its own with it: the foreign keys cascade, and email_events (no foreign key, hot insert)
// follows its emails through a trigger (migration 20261123070000-email-events-cleanup).
let ctx: TestContext;

beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => ctx?.close());

const sql = <T = Record<string, unknown>>(query: string, params: unknown[] = []) =>
  ctx.services.orm.em.fork().execute<T[]>(query, params, 'all');

async function sendWithEvents(token: string, organizationId: string): Promise<string> {
  const res = await ctx.app.inject({
    method: 'POST',
    url: '/api/v2/emails',
    headers: bearer(token),
    payload: { from: 'news@acme.test', to: 'reader@example.com', subject: 'Hi', markdown: 'Hello' },
  });
  expect(res.statusCode).toBe(200);
  const { id } = res.json();
  await sql(
    `insert into email_events (email_id, organization_id, type, url) values (?, ?, 'open', null), (?, ?, 'click', 'https://example.com'), (?, ?, 'delivered', null)`,
    [id, organizationId, id, organizationId, id, organizationId],
  );
  return id;
}

describe('deleting an organization', () => {
  it('removes its emails and their events, and leaves another organization\'s alone', async () => {
    const doomed = await createOrg(ctx.services, { name: 'Doomed' });
    const kept = await createOrg(ctx.services, { name: 'Kept' });
    const doomedEmail = await sendWithEvents(doomed.token, doomed.organizationId);
    const keptEmail = await sendWithEvents(kept.token, kept.organizationId);
    await ctx.app.inject({ method: 'POST', url: '/api/v2/subscribers', headers: bearer(doomed.token), payload: { email: 'a@example.com', tags: ['t'] } });
    await sql(`insert into suppressions (organization_id, address, reason) values (?, 'gone@example.com', 'hard_bounce')`, [doomed.organizationId]);

    await sql('delete from organizations where id = ?', [doomed.organizationId]);

    const count = async (table: string, column: string, value: string) =>
      (await sql<{ n: number }>(`select count(*)::int as n from ${table} where ${column} = ?`, [value]))[0]!.n;
    expect(await count('emails', 'organization_id', doomed.organizationId)).toBe(0);
    expect(await count('email_events', 'email_id', doomedEmail)).toBe(0);
    expect(await count('email_events', 'organization_id', doomed.organizationId)).toBe(0);
    for (const table of ['api_tokens', 'subscribers', 'tags', 'suppressions', 'email_idempotency_keys']) {
      expect({ table, n: await count(table, 'organization_id', doomed.organizationId) }).toEqual({ table, n: 0 });
    }
    // The other organization keeps everything.
    expect(await count('emails', 'id', keptEmail)).toBe(1);
    expect(await count('email_events', 'email_id', keptEmail)).toBe(3);
    const res = await ctx.app.inject({ url: `/api/v2/emails/${keptEmail}`, headers: bearer(kept.token) });
    expect(res.json().last_event).toBeDefined();
  });

  it('has no foreign key on email_events slowing the tracking insert', async () => {
    const constraints = await sql(`select conname from pg_constraint where conrelid = 'email_events'::regclass and contype = 'f'`);
    expect(constraints).toEqual([]);
  });
});

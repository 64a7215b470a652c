import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { insertTrackingEventsOnce } from '../src/shared/outcomes/queries.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

/**
 * Two writers on the same rows. Each test holds one write open in a transaction of its own,
 * starts the request, which waits for that transaction's locks, then commits. A delete
 * committed meanwhile: the request answers as if the row had been gone before it started,
 * never 500, and a second delete is 404. Writers that create the same rows: no deadlock.
 */
let ctx: TestContext;
let token: string;
let organizationId: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token, organizationId } = await createOrg(ctx.services));
});
afterAll(async () => {
  await ctx?.close();
});

function api(method: 'GET' | 'POST' | 'DELETE', url: string, body?: unknown) {
  return ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(token), ...(body === undefined ? {} : { payload: body as object }) });
}

const sql = <T = Record<string, unknown>>(query: string, params: unknown[] = []) => ctx.services.orm.em.fork().execute<T[]>(query, params, 'all');

/**
 * Runs `request` while `statements` are run and held uncommitted; runs `then` 300 ms later in
 * the same transaction (it must not wait on the request: it fails on a deadlock), then commits.
 */
async function duringDelete<T>(statements: [string, unknown[]][], request: () => Promise<T>, then: [string, unknown[]][] = []): Promise<T> {
  const client = new pg.Client({ connectionString: ctx.env.config.databaseUrl });
  await client.connect();
  try {
    await client.query('begin');
    for (const [text, values] of statements) await client.query(text, values);
    let answered = false;
    const answer = request().finally(() => {
      answered = true;
    });
    await sleep(300);
    // The request waits for the delete: otherwise this test would not test the race.
    expect(answered).toBe(false);
    for (const [text, values] of then) await client.query(text, values);
    await client.query('commit');
    return await answer;
  } finally {
    await client.end();
  }
}

describe('a delete committed while a request uses the row', () => {
  it('a webhook endpoint deleted meanwhile gets no event, and the subscriber write it would have failed succeeds', async () => {
    const endpoints: string[] = [];
    for (const name of ['gone', 'kept']) {
      const created = await api('POST', '/webhooks', { url: `https://hooks.example.com/${name}`, events: ['contact.created'] });
      expect(created.statusCode, created.body).toBe(200);
      endpoints.push(created.json().id);
    }
    const [gone, kept] = endpoints;
    const created = await duringDelete([['delete from webhook_endpoints where id = $1', [gone]]], () => api('POST', '/subscribers', { email: 'during-delete@example.com' }));
    expect(created.statusCode, created.body).toBe(200);
    const messages = await sql<{ endpoint_id: string }>(`select endpoint_id from webhook_messages where type = 'contact.created' and payload->'data'->>'id' = ?`, [created.json().id]);
    expect(messages.map((m) => m.endpoint_id)).toEqual([kept]);
  });

  it("a webhook's test event while the webhook is deleted is 404", async () => {
    const created = await api('POST', '/webhooks', { url: 'https://hooks.example.com/test', events: ['*'] });
    const id = created.json().id as string;
    const test = await duringDelete([['delete from webhook_endpoints where id = $1', [id]]], () => api('POST', `/webhooks/${id}/test`));
    expect(test.statusCode, test.body).toBe(404);
    expect(test.json().name).toBe('not_found');
  });

  it('a sender added while its domain is deleted is 422 naming email, and no sender is left', async () => {
    const domain = await api('POST', '/domains', { domain: 'going.example' });
    expect(domain.statusCode, domain.body).toBe(200);
    const id = domain.json().id as string;
    const sender = await duringDelete(
      [
        ['delete from senders where domain_id = $1', [id]],
        ['delete from domains where id = $1', [id]],
      ],
      () => api('POST', '/senders', { name: 'News', email: 'news@going.example' }),
    );
    expect(sender.statusCode, sender.body).toBe(422);
    expect(sender.json().name).toBe('validation_error');
    expect(sender.body).toMatch(/going\.example is not a domain of this organization/);
    expect(await sql(`select id from senders where organization_id = ? and email = 'news@going.example'`, [organizationId])).toEqual([]);
  });

  it('an open recorded while its email is purged leaves no event behind', async () => {
    const sent = await api('POST', '/emails', { from: 'a@acme.test', to: 'purged@example.com', subject: 'Old', html: '<p>x</p>' });
    expect(sent.statusCode, sent.body).toBe(200);
    const id = sent.json().id as string;
    // The retention purge's delete: its trigger deletes the email's events in the same statement.
    await duringDelete([['delete from emails where id = $1', [id]]], () =>
      insertTrackingEventsOnce(ctx.services.orm.em.fork(), [[id], ['open'], [new Date().toISOString()], ['203.0.113.9'], ['Mail/1.0'], [null]]),
    );
    expect(await sql('select email_id from email_events where email_id = ?', [id])).toEqual([]);
  });

  it('the second of two deletes of a campaign is 404', async () => {
    const campaign = await api('POST', '/campaigns', { name: 'Twice' });
    expect(campaign.statusCode, campaign.body).toBe(200);
    const id = campaign.json().id as string;
    const second = await duringDelete([['delete from campaigns where id = $1', [id]]], () => api('DELETE', `/campaigns/${id}`));
    expect(second.statusCode, second.body).toBe(404);
  });

  it('the second of two deletes of a domain is 404', async () => {
    const domain = await api('POST', '/domains', { domain: 'twice.example' });
    const id = domain.json().id as string;
    const second = await duringDelete([['delete from domains where id = $1', [id]]], () => api('DELETE', `/domains/${id}`));
    expect(second.statusCode, second.body).toBe(404);
  });
});

describe('writers creating the same rows at once', () => {
  it('a subscriber write and an import that both create a tag and the same address do not deadlock', async () => {
    // An import's order (import.ts): the new tag, then the subscribers, in one transaction.
    const now = new Date();
    const created = await duringDelete(
      [[`insert into tags (id, organization_id, name, created_at, updated_at) values ('tag_concurrent0000000000000000', $1, 'Fresh', $2, $2)`, [organizationId, now]]],
      () => api('POST', '/subscribers', { email: 'both@example.com', tags: ['fresh'] }),
      [
        [
          `insert into subscribers (id, organization_id, email, status, fields, created_at, updated_at)
           values ('sub_concurrent0000000000000000', $1, 'both@example.com', 'SUBSCRIBED', '{}', $2, $2) on conflict (organization_id, email) do nothing`,
          [organizationId, now],
        ],
      ],
    );
    expect(created.statusCode, created.body).toBe(200);
    expect(created.json().tags.map((t: { name: string }) => t.name)).toEqual(['Fresh']);
  });
});

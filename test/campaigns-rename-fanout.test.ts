import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFanOut, type FanOutDeps } from '../src/shared/campaigns/fanout.js';
import type { QueueProducer } from '../src/shared/queues/producer.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { createSenderRow } from './helpers/campaigns.js';

/**
 * docs/campaigns.md: renaming a tag renames it in every campaign's filters, so a filter keeps
 * meaning the same contacts, a campaign's fan-out under way included.
 */
let ctx: TestContext;

beforeAll(async () => {
  ctx = await createTestContext();
});
afterAll(async () => {
  await ctx?.close();
});

describe('a tag renamed while a campaign fans out', () => {
  it('changes nobody the campaign goes to, on the pages written after the rename', async () => {
    const o = await createOrg(ctx.services, { name: 'Rename during fan-out' });
    const api = (method: 'GET' | 'POST' | 'PATCH', url: string, payload?: object) =>
      ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(o.token), ...(payload ? { payload } : {}) });
    const senderId = await createSenderRow(ctx.services, o.organizationId, 'news@rename.test');
    for (let i = 1; i <= 4; i++) await api('POST', '/subscribers', { email: `club${i}@rename.test`, tags: ['club'] });
    for (let i = 1; i <= 3; i++) await api('POST', '/subscribers', { email: `other${i}@rename.test` });
    const created = await api('POST', '/campaigns', {
      name: 'Club news',
      subject: 's',
      senderId,
      content: 'Hi\n\n[Unsubscribe]({{unsubscribe_url}})',
      recipientFilters: [{ type: 'tag', op: 'has', value: 'club' }],
    });
    const id = created.json().id as string;
    expect((await api('POST', `/campaigns/${id}/send`, {})).statusCode).toBe(200);

    // One recipient a page. The first page's sends are held in the producer: the fan-out
    // writes the second page, then waits for them, and the tag is renamed meanwhile.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let adds = 0;
    let firstAdd!: () => void;
    const firstAdded = new Promise<void>((resolve) => (firstAdd = resolve));
    const producer = {
      add: async () => {
        if (adds++ === 0) {
          firstAdd();
          await held;
        }
      },
    } as unknown as QueueProducer;
    const deps: FanOutDeps = { producer, logger: ctx.services.logger, pageSize: 1, now: () => new Date(), policy: ctx.services.config };
    const fanOut = runFanOut(ctx.services.orm.em.fork(), deps, id);
    await firstAdded;
    expect((await api('PATCH', '/tags/club', { name: 'members' })).statusCode).toBe(200);
    release();
    expect(await fanOut).toBe('done');

    const rows = await ctx.services.orm.em.fork().execute<{ to_address: string }[]>('select to_address from emails where campaign_id = ? order by to_address', [id], 'all');
    expect(rows.map((r) => r.to_address)).toEqual(['club1@rename.test', 'club2@rename.test', 'club3@rename.test', 'club4@rename.test']);
  });
});

import { createHmac } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../src/shared/ids.js';
import { clickToken, openToken } from '../src/shared/outcomes/tokens.js';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { until } from './helpers/until.js';

/**
 * The global verification history (docs/security.md): every copy of an email carries the
 * same pixel and links (a bcc to oneself), so an open or a click says nothing about the
 * `to` address. Only trusted signals (the provider's delivery, bounces, complaints) feed it.
 */
const SECRET = 'provider-webhook-secret';
let ctx: TestContext;
let organizationId: string;

beforeAll(async () => {
  ctx = await createTestContext({ PROVIDER_WEBHOOK_SECRET: SECRET });
  ({ organizationId } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

async function sentEmail(to: string): Promise<{ id: string; messageId: string }> {
  const id = newId('eml');
  const messageId = `${id}@mailroom.test`;
  await ctx.services.orm.em.fork().execute(
    `insert into emails (id, organization_id, status, delivery_status, from_address, to_address, subject, content_kind, content, message_id)
     values (?, ?, 'sent', 'delivered', 'a@attacker.test', ?, 'hello', 'html', '<p>hi</p>', ?)`,
    [id, organizationId, to, messageId],
  );
  return { id, messageId };
}

const proven = async (address: string) =>
  (await ctx.services.orm.em.fork().execute<{ proven_at: Date | null }[]>('select proven_at from verification_history where email = ?', [address]))[0]?.proven_at ?? null;

describe('global verification history', () => {
  it('an open or a click of a copy does not prove the `to` address', async () => {
    const { id } = await sentEmail('ceo@victim.example');
    expect((await ctx.app.inject({ url: `/t/o/${openToken(ctx.services.signer, id)}.gif` })).statusCode).toBe(200);
    expect((await ctx.app.inject({ url: `/t/c/${clickToken(ctx.services.signer, id, 0, 'https://example.com/')}` })).statusCode).toBe(302);
    // The hits are written (first open and click set) ...
    await until(async () => {
      const [row] = await ctx.services.orm.em.fork().execute<{ o: Date | null; c: Date | null }[]>('select first_opened_at as o, first_clicked_at as c from emails where id = ?', [id]);
      return Boolean(row?.o && row?.c);
    }, Boolean, 5_000);
    // ... and the history of the address is untouched.
    expect(await proven('ceo@victim.example')).toBeNull();
  });

  it("the provider's delivery proves the address", async () => {
    const { messageId } = await sentEmail('reader@example.net');
    await ctx.services.orm.em.fork().execute(`update emails set delivery_status = null where message_id = ?`, [messageId]);
    const body = JSON.stringify({ type: 'delivered', messageId });
    const res = await ctx.app.inject({
      method: 'POST',
      url: '/webhooks/provider',
      headers: { 'content-type': 'application/json', 'x-mailroom-signature': `sha256=${createHmac('sha256', SECRET).update(body).digest('hex')}` },
      payload: body,
    });
    expect(res.statusCode).toBe(200);
    expect(await proven('reader@example.net')).not.toBeNull();
  });
});

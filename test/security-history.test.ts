import { createHmac } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../src/shared/ids.js';
import { clickToken, openToken } from '../src/shared/outcomes/tokens.js';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { until } from './helpers/until.js';

/**
 * The global verification history (docs/security.md): every copy of an email carries the
 * same pixel and links (a bcc to oneself), so an open or a click of an email with a copy says
 * nothing about the `to` address. Only the provider's delivery, bounces, complaints, and the
 * opens and clicks of an email that went to its recipient alone (docs/security.md) feed it.
 */
const SECRET = 'provider-webhook-secret';
let ctx: TestContext;
let organizationId: string;

beforeAll(async () => {
  ctx = await createTestContext({ PROVIDER_WEBHOOK_SECRET: SECRET });
  ({ organizationId } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

async function sentEmail(to: string, bcc: string[] | null = null): Promise<{ id: string; messageId: string }> {
  const id = newId('eml');
  const messageId = `${id}@mailroom.test`;
  await ctx.services.orm.em.fork().execute(
    `insert into emails (id, organization_id, status, delivery_status, from_address, to_address, bcc, subject, content_kind, content, message_id)
     values (?, ?, 'sent', 'delivered', 'a@attacker.test', ?, ?::jsonb, 'hello', 'html', '<p>hi</p>', ?)`,
    [id, organizationId, to, bcc ? JSON.stringify(bcc) : null, messageId],
  );
  return { id, messageId };
}

/** Opens and clicks an email, and waits until both are written. */
async function engage(id: string): Promise<void> {
  expect((await ctx.app.inject({ url: `/t/o/${openToken(ctx.services.signer, id)}.gif` })).statusCode).toBe(200);
  expect((await ctx.app.inject({ url: `/t/c/${clickToken(ctx.services.signer, id, 0, 'https://example.com/')}` })).statusCode).toBe(302);
  await until(async () => {
    const [row] = await ctx.services.orm.em.fork().execute<{ o: Date | null; c: Date | null }[]>('select first_opened_at as o, first_clicked_at as c from emails where id = ?', [id]);
    return Boolean(row?.o && row?.c);
  }, Boolean, 5_000);
}

const proven = async (address: string) =>
  (await ctx.services.orm.em.fork().execute<{ proven_at: Date | null }[]>('select proven_at from verification_history where email = ?', [address]))[0]?.proven_at ?? null;

describe('global verification history', () => {
  it('an open or a click of an email with a copy (a bcc to oneself) does not prove the `to` address', async () => {
    const { id } = await sentEmail('ceo@victim.example', ['me@attacker.test']);
    await engage(id);
    // The hits are written (first open and click set), and the history of the address is untouched.
    expect(await proven('ceo@victim.example')).toBeNull();
  });

  it('an open or a click of an email that went to its recipient alone proves the address (docs/security.md)', async () => {
    const { id } = await sentEmail('reader-alone@example.net');
    await engage(id);
    expect(await proven('reader-alone@example.net')).not.toBeNull();
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

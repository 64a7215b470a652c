import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deliverEndpoint, type WebhookClient } from '../src/shared/webhooks/dispatcher.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';

// One endpoint's run (dispatcher.ts `deliverEndpoint`), called directly: no worker runs here,
// so nothing else claims the messages.
let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => {
  await ctx?.close();
});

const api = (method: 'POST' | 'PATCH', url: string, payload?: object) =>
  ctx.app.inject({ method, url: `/api/v2${url}`, headers: bearer(token), ...(payload === undefined ? {} : { payload }) });

/** A client that answers 200, rotating the endpoint's secret during the first post and disabling it during the second. */
function rotateThenDisable(endpointId: string) {
  const posted: { headers: Record<string, string>; body: string }[] = [];
  let rotated: string | undefined;
  const client = {
    async post(_endpointId: string, _url: string, headers: Record<string, string>, body: string) {
      posted.push({ headers, body });
      if (posted.length === 1) rotated = (await api('POST', `/webhooks/${endpointId}/secret`)).json().secret as string;
      if (posted.length === 2) expect((await api('PATCH', `/webhooks/${endpointId}`, { enabled: false })).statusCode).toBe(200);
      return { ok: true, statusCode: 200, error: null };
    },
  } as unknown as WebhookClient;
  return { posted, client, rotated: () => rotated };
}

describe('an endpoint run', () => {
  it('stops at the next batch once the endpoint is disabled, and signs with a rotated secret from the next batch', async () => {
    const endpoint = (await api('POST', '/webhooks', { url: 'https://receiver.example/hook', events: ['*'] })).json() as { id: string; secret: string };
    for (let i = 0; i < 4; i++) expect((await api('POST', `/webhooks/${endpoint.id}/test`)).statusCode).toBe(200);

    const { posted, client, rotated: rotatedSecret } = rotateThenDisable(endpoint.id);

    const counts = await deliverEndpoint({ em: ctx.services.orm.em.fork(), box: ctx.services.box, client, clock: ctx.services.clock }, endpoint.id, { batch: 1, concurrency: 1 });
    // The user's disable after the second post stops the run: the other two wait.
    expect(counts).toEqual({ succeeded: 2, failed: 0 });
    expect(posted).toHaveLength(2);
    const [{ n }] = await ctx.services.orm.em.fork().execute<{ n: number }[]>(
      `select count(*)::int as n from webhook_messages where endpoint_id = ? and status = 'pending'`,
      [endpoint.id],
      'all',
    );
    expect(n).toBe(2);
    // The first post was signed with the secret of the creation, the second with the one
    // rotated in between.
    const verifies = (secret: string, i: number) => {
      try {
        new Webhook(secret).verify(posted[i]!.body, posted[i]!.headers);
        return true;
      } catch {
        return false;
      }
    };
    expect(verifies(endpoint.secret, 0)).toBe(true);
    const rotated = rotatedSecret();
    expect(rotated).toBeDefined();
    expect(verifies(rotated!, 1)).toBe(true);
    expect(verifies(endpoint.secret, 1)).toBe(false);
  });

  it('applies a rotated secret and a disable within a batch, once the endpoint is read again', async () => {
    const endpoint = (await api('POST', '/webhooks', { url: 'https://receiver.example/in-batch', events: ['*'] })).json() as { id: string; secret: string };
    for (let i = 0; i < 4; i++) expect((await api('POST', `/webhooks/${endpoint.id}/test`)).statusCode).toBe(200);
    const { posted, client, rotated } = rotateThenDisable(endpoint.id);
    // One batch of all four, read again before every post.
    const counts = await deliverEndpoint({ em: ctx.services.orm.em.fork(), box: ctx.services.box, client, clock: ctx.services.clock }, endpoint.id, { batch: 4, concurrency: 1, refreshMs: 0 });
    expect(counts).toEqual({ succeeded: 2, failed: 0 });
    expect(posted).toHaveLength(2);
    expect(() => new Webhook(rotated()!).verify(posted[1]!.body, posted[1]!.headers)).not.toThrow();
    // The two not posted wait as they were: unattempted, and claimable once enabled again.
    const waiting = await ctx.services.orm.em.fork().execute<{ attempts: number; locked_until: Date | null }[]>(
      `select attempts, locked_until from webhook_messages where endpoint_id = ? and status = 'pending'`,
      [endpoint.id],
      'all',
    );
    expect(waiting).toEqual([
      { attempts: 0, locked_until: null },
      { attempts: 0, locked_until: null },
    ]);
  });

  it("posts an endpoint's due events oldest first", async () => {
    const endpoint = (await api('POST', '/webhooks', { url: 'https://receiver.example/ordered', events: ['*'] })).json() as { id: string };
    for (let i = 0; i < 40; i++) expect((await api('POST', `/webhooks/${endpoint.id}/test`)).statusCode).toBe(200);
    // All due at the same moment: the order is the events' own (their ids are time-ordered).
    await ctx.services.orm.em.fork().execute(`update webhook_messages set next_attempt_at = now() - interval '1 minute' where endpoint_id = ?`, [endpoint.id]);
    const ids: string[] = [];
    const client = {
      async post(_endpointId: string, _url: string, headers: Record<string, string>) {
        ids.push(headers['webhook-id']!);
        return { ok: true, statusCode: 200, error: null };
      },
    } as unknown as WebhookClient;
    await deliverEndpoint({ em: ctx.services.orm.em.fork(), box: ctx.services.box, client, clock: ctx.services.clock }, endpoint.id, { batch: 16, concurrency: 1 });
    expect(ids).toHaveLength(40);
    expect(ids).toEqual([...ids].sort());
  });
});

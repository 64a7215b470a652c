import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../src/shared/config.js';
import { isPublicAddress } from '../src/shared/webhooks/ssrf.js';
import { webhookProcessor } from '../src/workers/webhooks.js';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startTestWorkers, type TestWorkers } from './helpers/hooks-workers.js';
import { startDnsServer, type TestDnsServer } from './helpers/dns-server.js';
import { waitFor } from './helpers/outages.js';
import { startWebhookReceiver, type WebhookReceiver } from './helpers/webhook-receiver.js';

// A public address (example.com's); these tests never connect to it.
const PUBLIC = '93.184.216.34';

let dns: TestDnsServer;
let ctx: TestContext;
let receiver: WebhookReceiver;
let token: string;
let workers: TestWorkers | undefined;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  dns = await startDnsServer({
    'public.test': { a: [PUBLIC] },
    'private.test': { a: ['10.1.2.3'] },
    'mixed.test': { a: [PUBLIC, '192.168.0.10'] },
    'metadata.test': { a: ['169.254.169.254'] },
    'ula.test': { aaaa: ['fd00::1'] },
    'rebind.test': { a: [PUBLIC] },
  });
  ctx = await createTestContext({ WEBHOOK_ALLOW_PRIVATE_URLS: 'false', DNS_SERVERS: dns.address });
  ({ token } = await createOrg(ctx.services));
  workers = await startTestWorkers(ctx, [webhookProcessor({ dispatchEveryMs: 200 }) as never]);
});
afterAll(async () => {
  await workers?.close();
  await ctx?.close();
  await dns?.close();
  await receiver?.close();
});

const create = (url: string) =>
  ctx.app.inject({ method: 'POST', url: '/api/v2/webhooks', headers: bearer(token), payload: { url, events: ['*'] } });

describe('SSRF guard', () => {
  it('classifies addresses: only global unicast is public', () => {
    for (const a of ['127.0.0.1', '10.0.0.1', '172.16.5.4', '192.168.1.1', '169.254.169.254', '100.64.0.1', '0.0.0.0', '::1', '::', 'fe80::1', 'fd00:ec2::254', '::ffff:127.0.0.1', '::7f00:1', '::808:808', '224.0.0.1', '255.255.255.255']) {
      expect(isPublicAddress(a), a).toBe(false);
    }
    for (const a of [PUBLIC, '8.8.8.8', '2606:4700:4700::1111', '::ffff:8.8.8.8']) expect(isPublicAddress(a), a).toBe(true);
  });

  it('refuses at create and update a URL whose host is or resolves to a non-public address (422 naming url)', async () => {
    const refused = [
      'http://127.0.0.1:8080/hook',
      'http://[::1]/hook',
      'http://localhost:3000/hook',
      'http://169.254.169.254/latest/meta-data',
      'http://[::ffff:127.0.0.1]/hook',
      // IPv4-compatible (::/96): 127.0.0.1, 10.0.0.1 and 192.168.0.1 written the deprecated way.
      'http://[::7f00:1]:8099/hook',
      'http://[::a00:1]/hook',
      'http://[::c0a8:1]/hook',
      'http://private.test/hook',
      'http://mixed.test/hook',
      'https://metadata.test/hook',
      'http://ula.test/hook',
      'http://nowhere.test/hook',
    ];
    for (const url of refused) {
      const response = await create(url);
      expect(response.statusCode, url).toBe(422);
      expect(response.json().details[0].path, url).toBe('url');
    }
    const [{ n }] = await ctx.services.orm.em.fork().execute<{ n: number }[]>('select count(*)::int as n from webhook_endpoints', [], 'all');
    expect(n).toBe(0);

    const ok = await create('https://public.test/hook');
    expect(ok.statusCode).toBe(200);
    const patched = await ctx.app.inject({ method: 'PATCH', url: `/api/v2/webhooks/${ok.json().id}`, headers: bearer(token), payload: { url: 'http://private.test/x' } });
    expect(patched.statusCode).toBe(422);
    expect(patched.json().details[0].path).toBe('url');
    const got = await ctx.app.inject({ url: `/api/v2/webhooks/${ok.json().id}`, headers: bearer(token) });
    expect(got.json().url).toBe('https://public.test/hook');
    await ctx.app.inject({ method: 'DELETE', url: `/api/v2/webhooks/${ok.json().id}`, headers: bearer(token) });
  });

  it('checks again at send time: a host whose DNS answer changed to loopback is not called', async () => {
    const port = new URL(receiver.url).port;
    const created = await create(`http://rebind.test:${port}/ok`);
    expect(created.statusCode).toBe(200);
    const id = created.json().id as string;
    // The name now points at the service's own machine (DNS rebinding).
    dns.set('rebind.test', { a: ['127.0.0.1'] });
    const test = await ctx.app.inject({ method: 'POST', url: `/api/v2/webhooks/${id}/test`, headers: bearer(token) });
    expect(test.statusCode).toBe(200);
    const delivery = await waitFor('attempt', async () => {
      const list = (await ctx.app.inject({ url: `/api/v2/webhooks/${id}/deliveries`, headers: bearer(token) })).json().data;
      return list[0]?.attempts >= 1 ? list[0] : undefined;
    });
    expect(delivery).toMatchObject({ status: 'pending', lastStatusCode: null });
    expect(delivery.lastError).toMatch(/127\.0\.0\.1/);
    expect(receiver.received).toHaveLength(0);
  });
});

describe('WEBHOOK_ALLOW_PRIVATE_URLS', () => {
  it('defaults to true outside production and false in production; a bad value names the variable', () => {
    expect(loadConfig({}).webhookAllowPrivateUrls).toBe(true);
    expect(loadConfig({ NODE_ENV: 'production', SECRET_KEY: 'x'.repeat(40) }).webhookAllowPrivateUrls).toBe(false);
    expect(loadConfig({ NODE_ENV: 'production', SECRET_KEY: 'x'.repeat(40), WEBHOOK_ALLOW_PRIVATE_URLS: 'true' }).webhookAllowPrivateUrls).toBe(true);
    expect(() => loadConfig({ WEBHOOK_ALLOW_PRIVATE_URLS: 'maybe' })).toThrow(ConfigError);
    expect(() => loadConfig({ WEBHOOK_ALLOW_PRIVATE_URLS: 'maybe' })).toThrow(/WEBHOOK_ALLOW_PRIVATE_URLS/);
  });
});

/**
 * `npm run bench:provider-events`: delivery events per second through `POST /webhooks/ses`
 * (an Amazon SNS notification, its SHA256withRSA signature verified against a certificate
 * fetched once over https and cached) against `POST /webhooks/provider` (the generic
 * HMAC-signed format of docs/outcomes.md) on the same API process, in one run. Target: ses >= 0.5 of provider.
 *
 * The API runs as its own process (it must trust the local HTTPS server's certificate
 * through NODE_EXTRA_CA_CERTS, read at start-up); autocannon fires from this process. Every
 * request is a `delivered` event of a distinct sent email, so each one does the full write
 * (event row, status update), not a replay. The routes alternate in BENCH_ROUNDS slices.
 * Environment: BENCH_EMAILS (events per route, default 10,000), BENCH_CONNECTIONS (default 10),
 * BENCH_ROUNDS (default 4).
 */
import autocannon from 'autocannon';
import { execFileSync } from 'node:child_process';
import { createHmac, createPrivateKey, createSign, randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBenchEnv, fmt, freePort, spawnService, stop } from './harness.js';

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 10);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 4);
// Events (of distinct emails) per route, a tenth of them for the warm-up.
const EMAILS_PER_ROUTE = Number(process.env.BENCH_EMAILS ?? 10_000);
const SECRET = 'bench-provider-secret';

const dir = mkdtempSync(join(tmpdir(), 'mailroom-bench-providers-'));
const openssl = (args: string[]) => execFileSync('openssl', args, { stdio: 'ignore' });
openssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'tls.key'), '-out', join(dir, 'tls.crt'), '-days', '2', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost']);
openssl(['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'sns.key'), '-out', join(dir, 'sns.crt'), '-days', '2', '-subj', '/CN=sns.amazonaws.com']);
const snsKey = createPrivateKey(readFileSync(join(dir, 'sns.key')));
const certificate = readFileSync(join(dir, 'sns.crt'));
let certFetches = 0;
const https = createServer({ key: readFileSync(join(dir, 'tls.key')), cert: readFileSync(join(dir, 'tls.crt')) }, (_req, res) => {
  certFetches++;
  res.writeHead(200).end(certificate);
});
await new Promise<void>((resolve) => https.listen(0, '127.0.0.1', resolve));
const certUrl = `https://localhost:${(https.address() as AddressInfo).port}/SimpleNotificationService-bench.pem`;

const bench = await createBenchEnv('providers', { PROVIDER_WEBHOOK_SECRET: SECRET, SNS_CERT_HOST_PATTERN: '^localhost$' });
const { services } = bench;
// Sent emails: the first half answered by the generic format (docs/outcomes.md "Provider webhook"),
// the second by SES's.
await services.orm.em.fork().execute(
  `insert into emails (id, organization_id, source, status, from_address, to_address, subject, content_kind, content, headers, message_id, provider_message_id, sent_at, created_at, updated_at)
   select 'eml_bench' || lpad(g::text, 8, '0'), ?, 'api', 'sent', 'news@bench.test', 'reader' || g || '@example.com', 'Bench', 'html', '<p>x</p>', '{}'::jsonb,
     'eml_bench' || lpad(g::text, 8, '0') || '@bench.test', '0100bench' || lpad(g::text, 8, '0') || '-000000', now(), now(), now()
   from generate_series(1, ?) g`,
  [bench.organizationId, EMAILS_PER_ROUTE * 2],
  'run',
);
await services.orm.em.fork().execute('analyze emails', [], 'run');
const id = (i: number) => `eml_bench${String(i).padStart(8, '0')}`;

function providerRequest(i: number) {
  const body = JSON.stringify({ type: 'delivered', messageId: `${id(i)}@bench.test` });
  const signature = `sha256=${createHmac('sha256', SECRET).update(body).digest('hex')}`;
  return { method: 'POST' as const, path: '/webhooks/provider', headers: { 'content-type': 'application/json', 'x-mailroom-signature': signature }, body };
}

function sesRequest(i: number) {
  const ses = { notificationType: 'Delivery', mail: { messageId: `0100bench${String(i).padStart(8, '0')}-000000`, destination: [`reader${i}@example.com`] }, delivery: { smtpResponse: '250 ok' } };
  const message: Record<string, string> = {
    Type: 'Notification',
    MessageId: randomUUID(),
    TopicArn: 'arn:aws:sns:eu-west-1:123456789012:bench',
    Message: JSON.stringify(ses),
    Timestamp: new Date().toISOString(),
    SignatureVersion: '2',
    SigningCertURL: certUrl,
  };
  const signer = createSign('RSA-SHA256');
  signer.update(['Message', 'MessageId', 'Timestamp', 'TopicArn', 'Type'].map((f) => `${f}\n${message[f]}\n`).join(''));
  message.Signature = signer.sign(snsKey, 'base64');
  return { method: 'POST' as const, path: '/webhooks/ses', headers: { 'content-type': 'text/plain; charset=UTF-8' }, body: JSON.stringify(message) };
}

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const api = await spawnService('src/api/server.ts', { ...bench.env, PORT: String(port), NODE_EXTRA_CA_CERTS: join(dir, 'tls.crt') }, `${base}/readyz`);

interface Prepared {
  path: string;
  headers: Record<string, string>;
  body: string;
}
// Every request is prepared (and SES's signed) before the run, so the bench process spends
// its CPU on sending, not on RSA signatures.
const prepare = (make: (i: number) => Prepared, from: number) => Array.from({ length: EMAILS_PER_ROUTE }, (_, i) => make(from + i));
const routes = {
  provider: { prepared: prepare(providerRequest, 1), next: 0, results: [] as autocannon.Result[] },
  ses: { prepared: prepare(sesRequest, EMAILS_PER_ROUTE + 1), next: 0, results: [] as autocannon.Result[] },
};

/** `amount` events of distinct emails, each sent once (autocannon would otherwise repeat its list per connection). */
async function slice(route: keyof typeof routes, amount: number): Promise<autocannon.Result> {
  const r = routes[route];
  if (r.next + amount > r.prepared.length) throw new Error('ran out of prepared events: raise BENCH_EMAILS');
  return autocannon({
    url: base,
    connections: CONNECTIONS,
    amount,
    requests: [
      {
        method: 'POST',
        setupRequest: (request) => {
          const next = r.prepared[r.next++]!;
          return { ...request, path: next.path, headers: next.headers, body: next.body };
        },
      },
    ],
  });
}

try {
  // Warm-up: JIT, connection pools, the certificate fetched and cached.
  const warmup = Math.floor(EMAILS_PER_ROUTE / 10);
  await slice('provider', warmup);
  await slice('ses', warmup);
  const perSlice = Math.floor((EMAILS_PER_ROUTE - warmup) / ROUNDS);
  for (let round = 0; round < ROUNDS; round++) {
    for (const route of round % 2 === 0 ? (['provider', 'ses'] as const) : (['ses', 'provider'] as const)) {
      routes[route].results.push(await slice(route, perSlice));
    }
  }
  const figures = Object.fromEntries(
    Object.entries(routes).map(([name, r]) => {
      const total = r.results.reduce((a, x) => a + x.requests.total, 0);
      const seconds = r.results.reduce((a, x) => a + x.duration, 0);
      const non2xx = r.results.reduce((a, x) => a + x.non2xx + x.errors, 0);
      return [name, { perSecond: total / seconds, p99: Math.max(...r.results.map((x) => x.latency.p99)), non2xx }];
    }),
  ) as Record<keyof typeof routes, { perSecond: number; p99: number; non2xx: number }>;
  const [{ n: delivered }] = await services.orm.em.fork().execute<{ n: number }[]>(`select count(*)::int as n from email_events where type = 'delivered'`, [], 'all');
  console.log(`provider events, ${CONNECTIONS} connections, ${fmt(EMAILS_PER_ROUTE)} events per route (a tenth for warm-up) in ${ROUNDS} alternating slices`);
  for (const [name, f] of Object.entries(figures)) console.log(`  /webhooks/${name.padEnd(9)} ${fmt(f.perSecond)} events/s  p99 ${f.p99} ms  non-2xx ${f.non2xx}`);
  console.log(`  delivered events recorded: ${fmt(delivered)}; certificate fetched ${certFetches} time(s)`);
  console.log(`  ratio ses / provider: ${fmt(figures.ses.perSecond / figures.provider.perSecond, 2)} (target >= 0.5)`);
} finally {
  await stop(api);
  await bench.dispose();
  https.close();
  rmSync(dir, { recursive: true, force: true });
}

/**
 * `npm run bench:dashboard`: the dashboard's pages with 1,000,000 emails and 100,000
 * subscribers in one organization (BENCH_EMAILS, BENCH_SUBSCRIBERS to change). The API
 * runs in this process; a signed-in session requests, one at a time, `GET /healthz` (the
 * baseline), the emails page, a recipient search and the subscribers page, BENCH_REQUESTS
 * times each (default 200), interleaved so that machine load hits every route alike. It
 * prints the time to first byte (p50, p95) of each and the ratio of its p95 to /healthz's.
 * Target: every page under 100 ms p95 on a quiet machine.
 */
import { buildApp } from '../src/api/app.js';
import { createUser } from '../src/shared/users/service.js';
import { createBenchEnv, fmt } from './harness.js';

const EMAILS = Number(process.env.BENCH_EMAILS ?? 1_000_000);
const SUBSCRIBERS = Number(process.env.BENCH_SUBSCRIBERS ?? 100_000);
const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 200);
const PASSWORD = 'bench password, long enough';

const bench = await createBenchEnv('dashboard');
const { services, organizationId } = bench;
const sql = (text: string, params: unknown[] = []) => services.orm.em.fork().execute(text, params, 'all');

try {
  let started = performance.now();
  // Set-based seeding: one statement per table. Ids are prefixed and sort by the series
  // number, as ULIDs sort by creation time; 1 in 1,000 emails goes to the same address.
  await sql(
    `insert into emails (id, organization_id, source, status, delivery_status, from_address, to_address, subject, content_kind, content, html, sent_at, message_id, created_at, updated_at)
     select 'eml_' || lpad(to_hex(g), 26, '0'), ?, 'api', 'sent', case when g % 10 = 0 then 'bounced' else 'delivered' end,
            'news@bench.test', case when g % 1000 = 0 then 'needle@example.com' else 'reader' || g || '@example.com' end,
            'Bench email ' || g, 'html', '<p>Hello</p>', '<p>Hello</p>', now(), 'eml_' || g || '@bench.test',
            now() - make_interval(secs => ? - g), now()
       from generate_series(1, ?) as g`,
    [organizationId, EMAILS, EMAILS],
  );
  await sql(
    `insert into subscribers (id, organization_id, email, name, status, created_at, updated_at)
     select 'sub_' || lpad(to_hex(g), 26, '0'), ?, 'subscriber' || g || '@example.com', 'Subscriber ' || g, 'SUBSCRIBED', now(), now()
       from generate_series(1, ?) as g`,
    [organizationId, SUBSCRIBERS],
  );
  await sql('analyze emails');
  await sql('analyze subscribers');
  console.log(`seeded ${fmt(EMAILS)} emails and ${fmt(SUBSCRIBERS)} subscribers in ${fmt((performance.now() - started) / 1000, 1)} s`);

  await createUser(services.orm.em.fork(), { organizationId, email: 'bench@bench.test', password: PASSWORD });
  const app = await buildApp(services);
  await app.listen({ host: '127.0.0.1', port: 0 });
  const base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  const signIn = await fetch(`${base}/app/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', origin: base },
    body: new URLSearchParams({ email: 'bench@bench.test', password: PASSWORD }),
    redirect: 'manual',
  });
  const cookie = signIn.headers.get('set-cookie')!.split(';')[0]!;

  const routes: Array<[string, string]> = [
    ['GET /healthz', '/healthz'],
    ['emails page', '/app/emails'],
    ['recipient search', '/app/emails?to=needle%40example.com'],
    ['bounced filter', '/app/emails?event=bounced'],
    ['subscribers page', '/app/audience'],
  ];
  const times = new Map<string, number[]>(routes.map(([name]) => [name, []]));
  // Warm-up: plans cached, pools filled.
  for (const [, path] of routes) for (let i = 0; i < 5; i++) await (await fetch(base + path, { headers: { cookie } })).arrayBuffer();
  started = performance.now();
  for (let i = 0; i < REQUESTS; i++) {
    for (const [name, path] of routes) {
      const t0 = performance.now();
      const response = await fetch(base + path, { headers: { cookie } });
      // fetch resolves when the status line and headers arrive: the time to first byte.
      times.get(name)!.push(performance.now() - t0);
      if (response.status !== 200) throw new Error(`${path} answered ${response.status}`);
      await response.arrayBuffer();
    }
  }
  const pct = (values: number[], p: number) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor((values.length * p) / 100))]!;
  const baseline = pct(times.get('GET /healthz')!, 95);
  console.log(`${REQUESTS} requests per route in ${fmt((performance.now() - started) / 1000, 1)} s`);
  console.log('route                 p50 ms   p95 ms   p95 / healthz p95');
  for (const [name] of routes) {
    const values = times.get(name)!;
    console.log(`${name.padEnd(20)} ${fmt(pct(values, 50), 1).padStart(7)} ${fmt(pct(values, 95), 1).padStart(8)}   ${fmt(pct(values, 95) / baseline, 1).padStart(6)}`);
  }
  await app.close();
} finally {
  await bench.dispose();
}

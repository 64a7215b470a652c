/**
 * `npm run bench:verify`: throughput and latency of POST /api/v2/verify against a real API
 * process, PostgreSQL, Redis and a DNS server on loopback, next to GET /healthz of the same
 * server in the same run.
 * - warm: every address on a few domains whose routing is already in the Redis cache;
 * - cold: every request a domain never seen (MX of the domain + A of its own exchange from
 *   the local DNS server, then cached).
 * Targets (issue 8): warm >= 3,000 checks/s with p99 <= 10 ms; cold >= 1,000 checks/s.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import autocannon from 'autocannon';
import { SecretBox } from '../src/shared/crypto.js';
import { initOrm, migrate } from '../src/shared/db/orm.js';
import { createOrganization } from '../src/shared/organizations/service.js';
import { adminQuery, databaseUrl, dropDatabase } from '../test/helpers/database.js';
import { startDnsServer, type FixtureZone } from '../test/helpers/dns-server.js';

const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 20);
const COLD_DOMAINS = 80_000;
/** Profiling aid: BENCH_ONLY_WARM=1 makes the other runs token ones. */
const ONLY_WARM = process.env.BENCH_ONLY_WARM === '1';
const SECRET_KEY = 'bench-secret-key-bench-secret-key-0123456789';

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

async function waitFor(url: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not come up`);
}

interface Figures {
  name: string;
  rps: number;
  p50: number;
  p99: number;
  non2xx: number;
  errors: number;
  cpuUsPerRequest: number;
}

/** CPU time (user + system, ms) the API process has used: independent of other load on the machine. */
function cpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // utime, stime in clock ticks (USER_HZ 100)
}

async function run(name: string, opts: autocannon.Options): Promise<Figures> {
  const before = cpuMs(api!.pid!);
  const result = await autocannon({ connections: CONNECTIONS, duration: DURATION, ...opts });
  const cpu = cpuMs(api!.pid!) - before;
  return {
    name,
    cpuUsPerRequest: Math.round((cpu * 1000) / Math.max(1, result.requests.total)),
    rps: Math.round(result.requests.average),
    p50: result.latency.p50,
    p99: result.latency.p99,
    non2xx: result.non2xx,
    errors: result.errors + result.timeouts,
  };
}

const dbName = `mailroom_bench_verify_${randomBytes(3).toString('hex')}`;
let api: ChildProcess | undefined;
const zone: FixtureZone = {
  'acme.io': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'mx.acme.io': { a: ['192.0.2.20'] },
  'shop.io': { mx: [{ priority: 10, exchange: 'mx.shop.io' }] },
  'mx.shop.io': { a: ['192.0.2.21'] },
  'gmail.com': { mx: [{ priority: 5, exchange: 'gmail-smtp-in.l.google.com' }] },
  'gmail-smtp-in.l.google.com': { a: ['192.0.2.10'] },
};
for (let i = 0; i < COLD_DOMAINS; i++) {
  zone[`c${i}.coldbench.net`] = { mx: [{ priority: 10, exchange: `mx.c${i}.coldbench.net` }] };
  zone[`mx.c${i}.coldbench.net`] = { a: ['192.0.2.99'] };
}
const dns = await startDnsServer(zone);

try {
  await adminQuery(`create database "${dbName}"`);
  const orm = await initOrm({ databaseUrl: databaseUrl(dbName), poolSize: 2 });
  await migrate(orm);
  const created = await createOrganization(orm.em.fork(), new SecretBox(SECRET_KEY), { name: 'Bench', verifyQuota: 100_000_000 });
  await orm.close(true);
  const token = created.token.token;

  const port = await freePort();
  api = spawn(process.execPath, [...(process.env.BENCH_NODE_OPTIONS?.split(' ').filter(Boolean) ?? []), '--import', 'tsx', 'src/api/server.ts'], {
    env: {
      ...process.env,
      NODE_ENV: 'production',
      SECRET_KEY,
      DATABASE_URL: databaseUrl(dbName),
      REDIS_PREFIX: `bench-verify-${randomBytes(3).toString('hex')}`,
      DNS_SERVERS: dns.address,
      PORT: String(port),
      HOST: '127.0.0.1',
      RATE_LIMIT_PER_SECOND: '100000000',
      LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const base = `http://127.0.0.1:${port}`;
  await waitFor(`${base}/healthz`);
  const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };

  let n = 0;
  const warmBody = () => JSON.stringify({ email: `user${n++}@${['acme.io', 'shop.io', 'gmail.com'][n % 3]}` });
  // Fill the routing cache and let the JIT settle.
  for (const d of ['acme.io', 'shop.io', 'gmail.com']) {
    await fetch(`${base}/api/v2/verify`, { method: 'POST', headers, body: JSON.stringify({ email: `first@${d}` }) });
  }
  await autocannon({ url: `${base}/healthz`, connections: CONNECTIONS, duration: 2 });
  await autocannon({
    url: `${base}/api/v2/verify`,
    connections: CONNECTIONS,
    duration: 2,
    requests: [{ method: 'POST', headers, setupRequest: (req) => ({ ...req, body: warmBody() }) }],
  });

  const healthz = await run('GET /healthz', { url: `${base}/healthz`, duration: ONLY_WARM ? 1 : DURATION });
  const warm = await run('POST /api/v2/verify, warm routing cache', {
    url: `${base}/api/v2/verify`,
    requests: [{ method: 'POST', headers, setupRequest: (req) => ({ ...req, body: warmBody() }) }],
  });
  dns.resetCounts();
  let c = 0;
  const cold = await run('POST /api/v2/verify, cold lookups', {
    url: `${base}/api/v2/verify`,
    requests: [
      {
        method: 'POST',
        headers,
        setupRequest: (req) => {
          if (ONLY_WARM) return { ...req, body: warmBody() };
          if (c >= COLD_DOMAINS) throw new Error('ran out of cold domains: raise COLD_DOMAINS');
          return { ...req, body: JSON.stringify({ email: `jane@c${c++}.coldbench.net` }) };
        },
      },
    ],
  });
  const coldQueries = dns.count();

  const rows = [healthz, warm, cold];
  console.log(`\nbench:verify — ${DURATION} s a run, ${CONNECTIONS} connections, API in its own process (NODE_ENV=production)\n`);
  console.log('| run | req/s | p50 ms | p99 ms | API CPU µs/req | non-2xx | errors |');
  console.log('|---|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) console.log(`| ${r.name} | ${r.rps} | ${r.p50} | ${r.p99} | ${r.cpuUsPerRequest} | ${r.non2xx} | ${r.errors} |`);
  console.log(`\nwarm / healthz = ${(warm.rps / healthz.rps).toFixed(2)}; cold / healthz = ${(cold.rps / healthz.rps).toFixed(2)}`);
  console.log(`cold run: ${c} new domains, ${coldQueries} DNS queries answered by the local server`);
  const ok = (b: boolean) => (b ? 'met' : 'MISSED');
  console.log(`targets: warm >= 3000/s ${ok(warm.rps >= 3000)}, warm p99 <= 10 ms ${ok(warm.p99 <= 10)}, cold >= 1000/s ${ok(cold.rps >= 1000)}`);
} finally {
  // Let the requests autocannon abandoned at the end of the last run finish first.
  await new Promise((r) => setTimeout(r, 1000));
  api?.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 500));
  await dns.close();
  await dropDatabase(dbName);
}

/**
 * `npm run bench:subscribers`: 100,000 subscribers created through the API (parallel
 * creates) and through `cli subscribers import FILE.csv`, then all of them listed by
 * cursor. Baseline: GET /healthz of the same API process in the same run.
 *
 * Targets (issue 3): API create >= 1,500/s; CSV import >= 10,000 rows/s; listing 100,000
 * by cursor in under 10 s. Uses a database and a Redis prefix of its own, dropped at the end.
 */
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import autocannon from 'autocannon';
import pg from 'pg';
import { SecretBox } from '../src/shared/crypto.js';
import { initOrm, migrate } from '../src/shared/db/orm.js';
import { createOrganization } from '../src/shared/organizations/service.js';
import { createRedis } from '../src/shared/redis.js';

const TOTAL = Number(process.env.BENCH_SUBSCRIBERS ?? 100_000);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const PAGE = 100;

const baseUrl = new URL(process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/mailroom');
const dbName = `mailroom_bench_subscribers_${process.pid}`;
const dbUrl = new URL(baseUrl);
dbUrl.pathname = `/${dbName}`;
const redisPrefix = `mrbench-sub-${process.pid}`;

async function admin(sql: string) {
  const url = new URL(baseUrl);
  url.pathname = '/postgres';
  const client = new pg.Client({ connectionString: url.toString() });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

const env: Record<string, string> = {
  ...(process.env as Record<string, string>),
  NODE_ENV: 'development',
  DATABASE_URL: dbUrl.toString(),
  REDIS_PREFIX: redisPrefix,
  SECRET_KEY: 'bench-secret-key-bench-secret-key-0123456789',
  LOG_LEVEL: 'silent',
  RATE_LIMIT_PER_SECOND: '100000000',
};

async function waitUp(url: string) {
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not come up`);
}

function cannon(options: autocannon.Options): Promise<autocannon.Result> {
  return new Promise((resolve, reject) => {
    autocannon(options, (error, result) => (error ? reject(error) : resolve(result)));
  });
}

async function main() {
  await admin(`drop database if exists "${dbName}" with (force)`);
  await admin(`create database "${dbName}"`);
  const orm = await initOrm({ databaseUrl: dbUrl.toString(), poolSize: 2 });
  await migrate(orm);
  const box = new SecretBox(env.SECRET_KEY);
  const apiOrg = await createOrganization(orm.em.fork(), box, { name: 'Bench API', verifyQuota: 0 });
  const csvOrg = await createOrganization(orm.em.fork(), box, { name: 'Bench CSV', verifyQuota: 0 });
  await orm.close(true);

  const port = await freePort();
  const server: ChildProcess = spawn(process.execPath, ['--import', 'tsx', 'src/api/server.ts'], {
    env: { ...env, PORT: String(port), HOST: '127.0.0.1' },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const dir = await mkdtemp(join(tmpdir(), 'mailroom-bench-'));
  const base = `http://127.0.0.1:${port}`;
  const headers = { authorization: `Bearer ${apiOrg.token.token}`, 'content-type': 'application/json' };
  try {
    await waitUp(`${base}/healthz`);
    // Warm-up, then the baseline.
    await cannon({ url: `${base}/healthz`, connections: CONNECTIONS, duration: 2 });
    const health = await cannon({ url: `${base}/healthz`, connections: CONNECTIONS, duration: 5 });
    const healthRps = health.requests.average;

    let n = 0;
    const started = performance.now();
    const create = await cannon({
      url: base,
      connections: CONNECTIONS,
      amount: TOTAL,
      requests: [
        {
          method: 'POST',
          path: '/api/v2/subscribers',
          headers,
          setupRequest: (req) => {
            const i = n++;
            return { ...req, body: JSON.stringify({ email: `user${i}@bench.example`, name: `User ${i}`, tags: ['bench', `group${i % 10}`], fields: { plan: i % 2 ? 'pro' : 'free' } }) };
          },
        },
      ],
    });
    const createSeconds = (performance.now() - started) / 1000;
    const createRate = create['2xx'] / createSeconds;

    const lines = ['email,name,phone,tags,plan,city'];
    for (let i = 0; i < TOTAL; i++) lines.push(`csv${i}@bench.example,Csv ${i},,bench;group${i % 10},${i % 2 ? 'pro' : 'free'},City ${i % 100}`);
    const file = join(dir, 'subscribers.csv');
    await writeFile(file, `${lines.join('\n')}\n`);
    const cliStarted = performance.now();
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', 'subscribers', 'import', file, '--org', csvOrg.organization.id, '--json'], {
      env,
      maxBuffer: 16 * 1024 * 1024,
    });
    const cliWall = (performance.now() - cliStarted) / 1000;
    const summary = JSON.parse(stdout) as { rows: number; created: number; seconds: number; rowsPerSecond: number };

    const listStarted = performance.now();
    let listed = 0;
    let after: string | undefined;
    for (;;) {
      const res = await fetch(`${base}/api/v2/subscribers?limit=${PAGE}${after ? `&after=${after}` : ''}`, { headers });
      const body = (await res.json()) as { has_more: boolean; data: Array<{ id: string }> };
      listed += body.data.length;
      if (!body.has_more) break;
      after = body.data[body.data.length - 1].id;
    }
    const listSeconds = (performance.now() - listStarted) / 1000;

    const figures = {
      subscribers: TOTAL,
      connections: CONNECTIONS,
      healthzRps: Math.round(healthRps),
      apiCreate: { ok: create['2xx'], non2xx: create.non2xx, errors: create.errors, seconds: +createSeconds.toFixed(2), perSecond: Math.round(createRate), p99Ms: create.latency.p99 },
      apiCreateToHealthzRatio: +(createRate / healthRps).toFixed(3),
      csvImport: { rows: summary.rows, created: summary.created, seconds: summary.seconds, rowsPerSecond: summary.rowsPerSecond, wallSecondsWithStartup: +cliWall.toFixed(2) },
      listByCursor: { listed, pageSize: PAGE, seconds: +listSeconds.toFixed(2), perSecond: Math.round(listed / listSeconds) },
      targets: {
        apiCreate: createRate >= 1500 ? 'met (>= 1,500/s)' : 'MISSED (>= 1,500/s)',
        csvImport: summary.rowsPerSecond >= 10_000 ? 'met (>= 10,000 rows/s)' : 'MISSED (>= 10,000 rows/s)',
        list: listSeconds < 10 && listed === TOTAL ? 'met (< 10 s)' : 'MISSED (< 10 s)',
      },
    };
    process.stdout.write(`${JSON.stringify(figures, null, 2)}\n`);
  } finally {
    server.kill('SIGTERM');
    await new Promise((r) => server.once('exit', r));
    await rm(dir, { recursive: true, force: true });
    await admin(`drop database if exists "${dbName}" with (force)`);
    const redis = createRedis(env.REDIS_URL || 'redis://127.0.0.1:6379', 'worker');
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `{${redisPrefix}}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length) await redis.del(...keys);
    } while (cursor !== '0');
    redis.disconnect();
  }
}

await main();

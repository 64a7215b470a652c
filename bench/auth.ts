/**
 * `npm run bench:auth`: the cost of authentication (token lookup, per-token rate limit in
 * Redis, permission check) on the hot path. It compares the authenticated
 * `GET /api/v2/tokens?limit=1` with the unauthenticated `GET /healthz` of the same server,
 * in one run. Target: the authenticated route at >= 60% of /healthz throughput.
 * It also measures `GET /api/v2/bench/noop`, a route added here to the real /api/v2 scope
 * (same auth hook, rate limiter and permission guard) that does no work of its own: the
 * cost of authentication alone, without the PostgreSQL query of the tokens list.
 *
 * The server runs in this process on the main thread, against a database and a Redis prefix
 * of its own (dropped at the end); autocannon fires from a worker thread so it does not
 * share the server's event loop. Environment: BENCH_DURATION (seconds per route, default
 * 10), BENCH_CONNECTIONS (default 20).
 */
import autocannon from 'autocannon';
import { v2Routes } from '../src/api/routes/index.js';
import { startApi } from '../src/api/server.js';
import { createBenchEnv } from './harness.js';

const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 20);
const WARMUP = 3;

interface Figures {
  route: string;
  requestsPerSecond: number;
  p50: number;
  p99: number;
  non2xx: number;
  errors: number;
}

async function fire(url: string, headers: Record<string, string>, duration: number): Promise<autocannon.Result> {
  return autocannon({ url, headers, connections: CONNECTIONS, duration, workers: 1 });
}

function figures(route: string, result: autocannon.Result): Figures {
  return {
    route,
    requestsPerSecond: Math.round(result.requests.average),
    p50: result.latency.p50,
    p99: result.latency.p99,
    non2xx: result.non2xx,
    errors: result.errors + result.timeouts,
  };
}

async function main(): Promise<void> {
  // The harness sets RATE_LIMIT_PER_SECOND far out of reach: the limiter runs, never refuses.
  const bench = await createBenchEnv('auth', { NODE_ENV: 'test', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'silent' });
  const { services } = bench;
  try {
    v2Routes.push(async (v2) => {
      v2.get('/bench/noop', { config: { permission: 'tokens' }, schema: { hide: true } }, async () => ({ ok: true }));
    });
    const app = await startApi(services);
    const { port } = app.server.address() as { port: number };
    const root = `http://127.0.0.1:${port}`;
    const auth = { authorization: `Bearer ${bench.token}` };

    const check = await fetch(`${root}/api/v2/tokens?limit=1`, { headers: auth });
    if (check.status !== 200) throw new Error(`GET /api/v2/tokens answered ${check.status}: ${await check.text()}`);

    console.log(`mailroom bench:auth — ${CONNECTIONS} connections, ${DURATION} s per route after ${WARMUP} s warm-up, Node ${process.version}`);
    const routes: Array<[string, string, Record<string, string>]> = [
      ['GET /healthz', '/healthz', {}],
      ['GET /api/v2/bench/noop (auth only)', '/api/v2/bench/noop', auth],
      ['GET /api/v2/tokens?limit=1', '/api/v2/tokens?limit=1', auth],
    ];
    for (const [, path, headers] of routes) await fire(`${root}${path}`, headers, WARMUP);
    const results: Figures[] = [];
    for (const [name, path, headers] of routes) results.push(figures(name, await fire(`${root}${path}`, headers, DURATION)));
    const [health, noop, tokens] = results as [Figures, Figures, Figures];

    console.table(results);
    const ratio = tokens.requestsPerSecond / health.requestsPerSecond;
    const authOnly = noop.requestsPerSecond / health.requestsPerSecond;
    console.log(`authenticated GET /api/v2/tokens?limit=1 / GET /healthz: ${(ratio * 100).toFixed(1)}% of throughput (target >= 60%)`);
    console.log(`authentication alone (noop route) / GET /healthz: ${(authOnly * 100).toFixed(1)}%`);
    console.log(
      JSON.stringify({ connections: CONNECTIONS, duration: DURATION, health, noop, tokens, ratio: Number(ratio.toFixed(3)), authOnlyRatio: Number(authOnly.toFixed(3)) }),
    );
    if (results.some((r) => r.non2xx > 0 || r.errors > 0)) {
      console.warn('warning: some requests failed; the figures are not comparable');
      process.exitCode = 1;
    }
    await app.close();
  } finally {
    await bench.dispose();
  }
}

await main();

/**
 * `npm run bench:tracking`: the open pixel (`GET /t/o/{token}.gif`) and the click redirect
 * (`GET /t/c/{token}`) against `GET /healthz` of the same server, in one run. Target: both
 * at >= 70% of /healthz throughput, with every hit recorded: after the run the app is
 * closed (the tracking recorder writes what it buffered) and the `email_events` rows are
 * counted against the 200/302 answers autocannon received (warm-up included).
 *
 * The server runs in this process on the main thread against a database and Redis prefix
 * of its own (dropped at the end); autocannon fires from a worker thread. The hits are
 * spread over EMAILS emails, so first opens / first clicks happen during the run too.
 * Environment: BENCH_DURATION (seconds per route, default 10, taken in BENCH_ROUNDS = 5
 * interleaved slices), BENCH_CONNECTIONS (default 20).
 */
import autocannon from 'autocannon';
import { startApi } from '../src/api/server.js';
import { createBenchEnv, seedTrackedEmails } from './harness.js';

const DURATION = Number(process.env.BENCH_DURATION ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 20);
const WARMUP = 3;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const EMAILS = 500;

interface Figures {
  route: string;
  requestsPerSecond: number;
  p50: number;
  p99: number;
  answered: number;
  errors: number;
}

async function fire(root: string, paths: string[], duration: number): Promise<autocannon.Result> {
  // Each connection walks the list (autocannon cycles through `requests`).
  return autocannon({
    url: root,
    connections: CONNECTIONS,
    duration,
    workers: 1,
    requests: paths.map((path) => ({ method: 'GET' as const, path })),
  });
}

function combine(route: string, results: autocannon.Result[]): Figures {
  const sum = (f: (r: autocannon.Result) => number) => results.reduce((a, r) => a + f(r), 0);
  return {
    route,
    requestsPerSecond: Math.round(sum((r) => r.requests.total) / sum((r) => r.duration)),
    p50: Math.max(...results.map((r) => r.latency.p50)),
    p99: Math.max(...results.map((r) => r.latency.p99)),
    answered: sum((r) => r['2xx'] + r['3xx']),
    errors: sum((r) => r.errors + r.timeouts + r['4xx'] + r['5xx']),
  };
}

async function main(): Promise<void> {
  const bench = await createBenchEnv('tracking', { NODE_ENV: 'test', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'silent' });
  const { services } = bench;
  try {
    const { opens, clicks } = await seedTrackedEmails(bench, EMAILS);

    const app = await startApi(services);
    const { port } = app.server.address() as { port: number };
    const root = `http://127.0.0.1:${port}`;
    const probe = await fetch(`${root}${clicks[0]}`, { redirect: 'manual' });
    if (probe.status !== 302) throw new Error(`click answered ${probe.status}`);

    console.log(`mailroom bench:tracking — ${CONNECTIONS} connections, ${DURATION} s per route in ${ROUNDS} interleaved slices after ${WARMUP} s warm-up, Node ${process.version}`);
    const routes: Array<[string, string[]]> = [
      ['GET /healthz', ['/healthz']],
      ['GET /t/o/{token}.gif (open pixel)', opens],
      ['GET /t/c/{token} (click redirect)', clicks],
    ];
    let expectedHits = 1; // the probe
    for (const [name, paths] of routes) {
      const warm = await fire(root, paths, WARMUP);
      if (name !== 'GET /healthz') expectedHits += warm['2xx'] + warm['3xx'];
    }
    // The routes take turns in ROUNDS short slices rather than one long run each, so a
    // change in the machine's load (it is shared) weighs on all of them alike.
    const slice = Math.max(1, Math.round(DURATION / ROUNDS));
    const runs = routes.map(() => [] as autocannon.Result[]);
    for (let round = 0; round < ROUNDS; round++) {
      for (const [r, [name, paths]] of routes.entries()) {
        const result = await fire(root, paths, slice);
        if (name !== 'GET /healthz') expectedHits += result['2xx'] + result['3xx'];
        runs[r]!.push(result);
      }
    }
    const results = routes.map(([name], r) => combine(name, runs[r]!));
    const [health, open, click] = results as [Figures, Figures, Figures];

    // Closing the app writes the hits still buffered (graceful shutdown loses none).
    const closing = Date.now();
    await app.close();
    const flushMs = Date.now() - closing;
    const [counted] = await services.orm.em.fork().execute<{ events: number; opened: number; clicked: number }[]>(
      `select (select count(*)::int from email_events) as events,
              (select count(*)::int from emails where first_opened_at is not null) as opened,
              (select count(*)::int from emails where first_clicked_at is not null) as clicked`,
      [],
      'all',
    );

    console.table(results);
    const openRatio = open.requestsPerSecond / health.requestsPerSecond;
    const clickRatio = click.requestsPerSecond / health.requestsPerSecond;
    console.log(`open pixel / GET /healthz: ${(openRatio * 100).toFixed(1)}% of throughput (target >= 70%)`);
    console.log(`click redirect / GET /healthz: ${(clickRatio * 100).toFixed(1)}% of throughput (target >= 70%)`);
    console.log(`hits answered ${expectedHits}, events recorded ${counted!.events} (close flushed in ${flushMs} ms); emails opened ${counted!.opened}/${EMAILS}, clicked ${counted!.clicked}/${EMAILS}`);
    console.log(
      JSON.stringify({
        connections: CONNECTIONS,
        duration: DURATION,
        health,
        open,
        click,
        openRatio: Number(openRatio.toFixed(3)),
        clickRatio: Number(clickRatio.toFixed(3)),
        hitsAnswered: expectedHits,
        eventsRecorded: counted!.events,
      }),
    );
    // autocannon stops with one request in flight per connection: the server answers (and
    // records) it, autocannon does not count it. So up to CONNECTIONS per run more.
    const inFlight = CONNECTIONS * (2 + 2 * ROUNDS);
    console.log(`recorded - answered = ${counted!.events - expectedHits} (0..${inFlight}: requests in flight when autocannon stopped)`);
    if (counted!.events < expectedHits || counted!.events > expectedHits + inFlight) {
      console.warn('warning: recorded events do not match answered hits');
      process.exitCode = 1;
    }
    if (results.some((r) => r.errors > 0)) {
      console.warn('warning: some requests failed; the figures are not comparable');
      process.exitCode = 1;
    }
  } finally {
    await bench.dispose();
  }
}

await main();

/**
 * npm run bench:tools — what running an endpoint as a tool costs: requests/s of
 * GET /healthz (baseline), GET /api/v2/domains (the endpoint), POST /api/v2/tools/list_domains
 * (the same endpoint dispatched in-process) and an MCP tools/call of list_domains on /mcp
 * (a stateless MCP server per request), with autocannon against the app on loopback.
 */
import autocannon from 'autocannon';
import setup from '../test/helpers/global-setup.js';
import { bearer, createOrg, createTestContext } from '../test/helpers/context.js';

const DURATION = Number(process.env.BENCH_DURATION ?? 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 16);

async function main(): Promise<void> {
  const teardown = await setup();
  const ctx = await createTestContext({ RATE_LIMIT_PER_SECOND: '100000000' });
  try {
    const { token } = await createOrg(ctx.services);
    for (const domain of ['one.bench.test', 'two.bench.test']) {
      await ctx.app.inject({ method: 'POST', url: '/api/v2/domains', headers: bearer(token), payload: { domain } });
    }
    const base = await ctx.app.listen({ host: '127.0.0.1', port: 0 });
    const auth = bearer(token);
    const json = { ...auth, 'content-type': 'application/json' };
    const cases = [
      { label: 'GET /healthz', method: 'GET' as const, path: '/healthz', headers: {} },
      { label: 'GET /api/v2/domains', method: 'GET' as const, path: '/api/v2/domains', headers: auth },
      {
        label: 'POST /api/v2/tools/list_domains',
        method: 'POST' as const,
        path: '/api/v2/tools/list_domains',
        headers: json,
        body: JSON.stringify({ arguments: {} }),
      },
      {
        label: 'MCP tools/call list_domains',
        method: 'POST' as const,
        path: '/mcp',
        headers: { ...json, accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'list_domains', arguments: {} } }),
      },
    ];
    const rates: Record<string, number> = {};
    // Two rounds (the machine's load varies): the figures of the second are kept.
    for (const round of [1, 2]) for (const item of cases) {
      // Short warm-up, then the measured run.
      await autocannon({ url: base + item.path, method: item.method, headers: item.headers, body: item.body, duration: 1, connections: CONNECTIONS });
      const result = await autocannon({
        url: base + item.path,
        method: item.method,
        headers: item.headers,
        body: item.body,
        duration: DURATION,
        connections: CONNECTIONS,
      });
      const bad = result.non2xx + result.errors;
      rates[item.label] = result.requests.average;
      console.log(
        `round ${round} ${item.label.padEnd(34)} ${Math.round(result.requests.average).toLocaleString('en-US').padStart(7)} req/s  p99 ${result.latency.p99} ms${bad ? `  (${bad} non-2xx/errors)` : ''}`,
      );
    }
    const endpoint = rates['GET /api/v2/domains']!;
    const healthz = rates['GET /healthz']!;
    console.log(`endpoint / healthz: ${(endpoint / healthz).toFixed(2)}`);
    console.log(`tool call / endpoint: ${(rates['POST /api/v2/tools/list_domains']! / endpoint).toFixed(2)}`);
    console.log(`MCP call / endpoint: ${(rates['MCP tools/call list_domains']! / endpoint).toFixed(2)}`);
  } finally {
    await ctx.close();
    await teardown();
  }
}

await main();

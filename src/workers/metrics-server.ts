import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Services } from '../shared/container.js';
import { dependencyStatus, downDependencies } from '../shared/dependencies.js';
import { METRICS_LOCAL_ONLY, metricsAccess, OPERATOR_CHALLENGE } from '../shared/operator-auth.js';
import { listenOn } from '../shared/startup.js';

export interface MetricsServer {
  port: number;
  close(): Promise<void>;
}

/**
 * The HTTP side of a worker process (WORKER_METRICS_PORT), on HOST: `GET /metrics` (same
 * rule as the API: basic auth as admin when ADMIN_PASSWORD is set, loopback peers only when not), `GET /healthz` and
 * `GET /readyz` (503 while PostgreSQL or Redis is down or the workers are paused).
 * Workers never answer the API; this is all they serve.
 */
export async function startMetricsServer(services: Services, port: number, isPaused: () => boolean): Promise<MetricsServer> {
  const { metrics, config } = services;
  const json = (status: number, body: unknown) => ({ status, type: 'application/json', body: JSON.stringify(body) });

  async function answer(method: string, url: string, headers: IncomingHttpHeaders, peer: string | undefined) {
    const path = url.split('?')[0];
    if (method !== 'GET' && method !== 'HEAD') return json(405, { name: 'method_not_allowed', message: 'GET only', statusCode: 405 });
    if (path === '/healthz') return json(200, { status: 'ok' });
    if (path === '/readyz') {
      const checks = await dependencyStatus(services);
      const down = downDependencies(checks);
      if (down.length === 0 && !isPaused()) return json(200, { status: 'ready', checks });
      const message = down.length > 0 ? `Unavailable: ${down.join(', ')}` : 'Workers paused: waiting for dependencies';
      return json(503, { name: 'service_unavailable', message, statusCode: 503, checks });
    }
    if (path === '/metrics') {
      const access = metricsAccess(config, peer, headers);
      if (access === 'credentials') {
        return { ...json(401, { name: 'unauthorized', message: 'Operator credentials required', statusCode: 401 }), challenge: true };
      }
      if (access === 'local-only') return json(403, { name: 'forbidden', message: METRICS_LOCAL_ONLY, statusCode: 403 });
      return { status: 200, type: metrics.registry.contentType, body: await metrics.scrape() };
    }
    return json(404, { name: 'not_found', message: `No route ${method} ${path}`, statusCode: 404 });
  }

  const server: Server = createServer((request, response) => {
    answer(request.method ?? 'GET', request.url ?? '/', request.headers, request.socket.remoteAddress).then(
      (result) => {
        const headers: Record<string, string> = { 'content-type': result.type };
        if ('challenge' in result) headers['www-authenticate'] = OPERATOR_CHALLENGE;
        // As the API's 503: when to ask again.
        if (result.status === 503) headers['retry-after'] = '5';
        response.writeHead(result.status, headers).end(request.method === 'HEAD' ? undefined : result.body);
      },
      (error: unknown) => {
        services.logger.error({ err: error }, 'worker metrics request failed');
        response.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ name: 'internal_error', message: 'Internal error', statusCode: 500 }));
      },
    );
  });
  await listenOn({ server, listen: (p, h, callback) => server.listen(p, h, callback) }, { variable: 'HOST', value: config.host }, { variable: 'WORKER_METRICS_PORT', value: port });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/**
 * The server of a process that is not the API (worker, inbound, smtp) when
 * `WORKER_METRICS_PORT` is set, its port logged; undefined otherwise.
 */
export async function startConfiguredMetricsServer(services: Services, isPaused: () => boolean): Promise<MetricsServer | undefined> {
  const port = services.config.workerMetricsPort;
  if (port === undefined) return undefined;
  const server = await startMetricsServer(services, port, isPaused);
  services.logger.info({ port: server.port }, 'metrics listening');
  return server;
}

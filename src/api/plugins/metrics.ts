import type { App } from '../types.js';
import { basicAuthGuard } from './admin.js';

/**
 * HTTP metrics of every route (recorded in onResponse, labelled by the route pattern, never
 * the raw URL, so ids in paths do not multiply series) and `GET /metrics` in Prometheus text.
 * Called on the root app before any route is registered.
 *
 * `/metrics` is open while ADMIN_PASSWORD is unset and asks the same basic auth as the
 * dashboard when it is set: the API port is the public one, and the figures (volumes, queue
 * depths) are the operator's business (docs/operations.md).
 */
export function registerMetrics(app: App): void {
  const { metrics, config } = app.services;

  app.addHook('onResponse', async (request, reply) => {
    const labels = {
      method: request.method,
      // No route matched (404): one series for all of them.
      route: request.routeOptions.url ?? 'unmatched',
      status_code: String(reply.statusCode),
    };
    metrics.httpRequests.inc(labels);
    metrics.httpRequestDuration.observe(labels, reply.elapsedTime / 1000);
  });

  app.get(
    '/metrics',
    {
      schema: { hide: true },
      ...(config.adminPassword ? { onRequest: basicAuthGuard(config.adminPassword) } : {}),
    },
    async (_request, reply) => {
      const body = await metrics.registry.metrics();
      return reply.header('content-type', metrics.registry.contentType).send(body);
    },
  );
}

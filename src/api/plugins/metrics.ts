import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Metrics } from '../../shared/metrics.js';
import type { App } from '../types.js';
import { METRICS_LOCAL_ONLY, metricsAccess, OPERATOR_CHALLENGE, OPERATOR_USER } from '../../shared/operator-auth.js';
import { isDispatched } from '../tools/dispatch.js';
import { errorBody } from './errors.js';

/** One answer in the HTTP metrics, by route pattern (never the raw URL) and status. */
export function countAnswer(metrics: Metrics, request: FastifyRequest, reply: FastifyReply, route: string): void {
  const labels = { method: request.method, route, status_code: String(reply.statusCode) };
  metrics.httpRequests.inc(labels);
  metrics.httpRequestDuration.observe(labels, reply.elapsedTime / 1000);
}

/**
 * HTTP metrics of every route (recorded in onResponse, labelled by the route pattern, never
 * the raw URL, so ids in paths do not multiply series) and `GET /metrics` in Prometheus text.
 * Called on the root app before any route is registered.
 *
 * `/metrics` asks the same basic auth as the dashboard when ADMIN_PASSWORD is set, and is
 * answered to loopback peers only while it is unset: the API port is the public one, and
 * the figures (volumes, queue depths) are the operator's business (docs/operations.md,
 * docs/security.md). Concurrent scrapes share one collection (metrics.scrape).
 */
export function registerMetrics(app: App): void {
  const { metrics, config } = app.services;

  // No route matched (404): one series for all of them. A request dispatched in-process (the
  // v2 twin of a v1 call, a tool call, an MCP call) is part of its client's request, counted once.
  app.addHook('onResponse', async (request, reply) => {
    if (!isDispatched(request)) countAnswer(metrics, request, reply, request.routeOptions.url ?? 'unmatched');
  });

  app.get(
    '/metrics',
    {
      schema: { hide: true },
      onRequest: async (request, reply) => {
        const access = metricsAccess(config, request.socket.remoteAddress, request.headers);
        if (access === 'credentials') {
          await reply
            .code(401)
            .header('WWW-Authenticate', OPERATOR_CHALLENGE)
            .send(errorBody(401, 'unauthorized', `Operator credentials required (HTTP basic auth as "${OPERATOR_USER}")`));
        } else if (access === 'local-only') {
          await reply.code(403).send(errorBody(403, 'forbidden', METRICS_LOCAL_ONLY));
        }
      },
    },
    async (_request, reply) => {
      const body = await metrics.scrape();
      return reply.header('content-type', metrics.registry.contentType).send(body);
    },
  );
}

import { z } from 'zod';
import { dependencyStatus, downDependencies } from '../../shared/dependencies.js';
import { errorBody } from '../plugins/errors.js';
import type { App } from '../types.js';

export { dependencyStatus };

export async function healthRoutes(app: App): Promise<void> {
  app.get(
    '/healthz',
    { schema: { hide: true, response: { 200: z.object({ status: z.literal('ok') }) } } },
    async () => ({ status: 'ok' as const }),
  );

  app.get('/readyz', { schema: { hide: true } }, async (_request, reply) => {
    const checks = await dependencyStatus(app.services);
    const down = downDependencies(checks);
    if (down.length === 0) return { status: 'ready', checks };
    void reply.header('Retry-After', '5');
    return reply.code(503).send({
      ...errorBody(503, 'service_unavailable', `Unavailable: ${down.join(', ')}`),
      checks,
    });
  });
}

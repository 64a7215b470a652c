import { z } from 'zod';
import type { Services } from '../../shared/container.js';
import { errorBody } from '../plugins/errors.js';
import type { App } from '../types.js';

const READY_TIMEOUT_MS = 2_000;

async function probe(check: () => Promise<unknown>): Promise<'up' | 'down'> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      check(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error('timeout')), READY_TIMEOUT_MS);
      }),
    ]);
    return 'up';
  } catch {
    return 'down';
  } finally {
    clearTimeout(timer);
  }
}

export async function dependencyStatus(services: Services) {
  const [postgres, redis] = await Promise.all([
    probe(() => services.orm.em.fork().getConnection().execute('select 1')),
    probe(() => services.redis.ping()),
  ]);
  return { postgres, redis };
}

export async function healthRoutes(app: App): Promise<void> {
  app.get(
    '/healthz',
    { schema: { hide: true, response: { 200: z.object({ status: z.literal('ok') }) } } },
    async () => ({ status: 'ok' as const }),
  );

  app.get('/readyz', { schema: { hide: true } }, async (_request, reply) => {
    const checks = await dependencyStatus(app.services);
    const down = Object.entries(checks).filter(([, state]) => state === 'down').map(([name]) => name);
    if (down.length === 0) return { status: 'ready', checks };
    return reply.code(503).send({
      ...errorBody(503, 'service_unavailable', `Unavailable: ${down.join(', ')}`),
      checks,
    });
  });
}

import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { FastifyAdapter } from '@bull-board/fastify';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { isOperator, OPERATOR_CHALLENGE, OPERATOR_USER } from '../../shared/operator-auth.js';
import { QUEUE_NAMES } from '../../shared/queues/registry.js';
import type { App } from '../types.js';
import { errorBody } from './errors.js';

export const DASHBOARD_PATH = '/admin/queues';

/** onRequest hook: HTTP basic auth as `admin` / ADMIN_PASSWORD, or 401 with a challenge. */
export function basicAuthGuard(password: string) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    if (isOperator(request.headers.authorization, password)) return;
    // Answered here rather than thrown: the board's routes have an error handler of their own.
    await reply
      .code(401)
      .header('WWW-Authenticate', OPERATOR_CHALLENGE)
      .send(errorBody(401, 'unauthorized', `Operator credentials required (HTTP basic auth as "${OPERATOR_USER}")`));
  };
}

/**
 * Bull Board at /admin/queues over every queue of the registry, so a queue a feature adds
 * appears with no change here. Off (404, nothing registered) while ADMIN_PASSWORD is unset.
 * Retry and clean are Bull Board's own actions on each queue.
 */
export async function adminDashboard(app: App): Promise<void> {
  const password = app.services.config.adminPassword;
  if (!password) return;

  const serverAdapter = new FastifyAdapter();
  serverAdapter.setBasePath(DASHBOARD_PATH);
  createBullBoard({
    queues: QUEUE_NAMES.map((name) => new BullMQAdapter(app.services.producer.queue(name), { allowRetries: true })),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'mailroom queues' } },
  });

  app.addHook('onRequest', basicAuthGuard(password));
  await app.register(serverAdapter.registerPlugin(), { prefix: DASHBOARD_PATH });
}

import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { FastifyAdapter } from '@bull-board/fastify';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { safeEqual, sha256Hex } from '../../shared/crypto.js';
import { QUEUE_NAMES } from '../../shared/queues/registry.js';
import type { App } from '../types.js';
import { errorBody } from './errors.js';

export const ADMIN_USER = 'admin';
export const DASHBOARD_PATH = '/admin/queues';

/**
 * The user and password of an `Authorization: Basic` header, or undefined. Any other
 * scheme (an API bearer token in particular) is no credential here.
 */
function basicCredentials(request: FastifyRequest): { user: string; password: string } | undefined {
  const match = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(request.headers.authorization ?? '');
  if (!match) return undefined;
  const decoded = Buffer.from(match[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 0) return undefined;
  return { user: decoded.slice(0, colon), password: decoded.slice(colon + 1) };
}

/**
 * onRequest hook: HTTP basic auth as `admin` / ADMIN_PASSWORD (contract 14). Both parts are
 * compared in constant time, on their SHA-256 so that not even the length leaks, and both
 * are always compared so a right user name takes as long as a wrong one.
 */
export function basicAuthGuard(password: string) {
  const expectedUser = sha256Hex(ADMIN_USER);
  const expectedPassword = sha256Hex(password);
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const given = basicCredentials(request);
    const userOk = safeEqual(sha256Hex(given?.user ?? ''), expectedUser);
    const passwordOk = safeEqual(sha256Hex(given?.password ?? ''), expectedPassword);
    if (given && userOk && passwordOk) return;
    // Answered here rather than thrown: the board's routes have an error handler of their own.
    await reply
      .code(401)
      .header('WWW-Authenticate', 'Basic realm="mailroom operators", charset="UTF-8"')
      .send(errorBody(401, 'unauthorized', `Operator credentials required (HTTP basic auth as "${ADMIN_USER}")`));
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

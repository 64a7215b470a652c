import { startApi } from './api/server.js';
import { startInbound } from './inbound/server.js';
import { bootConfig, handleShutdown } from './shared/boot.js';
import { closeServices, createServices } from './shared/container.js';
import { ensureDatabase, migrate } from './shared/db/orm.js';
import { startSubmission } from './smtp/server.js';
import { startWorkerProcess } from './workers/main.js';

// `npm start`: one process for a laptop or a small server. It creates the database when
// missing, applies migrations, then serves the API and runs every worker. Ctrl-C stops
// taking requests, lets active requests and jobs finish, then exits.
const { config, logger } = bootConfig('mailroom');
const shutdown = handleShutdown(logger);
try {
  if (await ensureDatabase(config.databaseUrl)) logger.info('created the database');
} catch (error) {
  logger.fatal({ err: error }, `cannot reach PostgreSQL at ${new URL(config.databaseUrl).host}`);
  process.exit(1);
}
const services = await createServices(config, logger);
const applied = await migrate(services.orm);
if (applied.length > 0) logger.info({ applied }, 'applied migrations');
// The listeners first: while Redis is unreachable the workers wait for it, and meanwhile the
// API answers (503 on /readyz and on what needs Redis) instead of refusing connections.
async function startAll(): Promise<void> {
  const app = await startApi(services);
  // The bound address, not the configured one: PORT=0 lets the OS choose.
  const bound = app.server.address();
  const where = bound && typeof bound === 'object' ? `${bound.family === 'IPv6' ? `[${bound.address}]` : bound.address}:${bound.port}` : `${config.host}:${config.port}`;
  logger.info(`API listening on http://${where}`);
  // Bounces and complaints by mail (docs/outcomes.md), on INBOUND_SMTP_HOST:INBOUND_SMTP_PORT.
  const inbound = await startInbound(services);
  logger.info(`inbound SMTP for bounces and complaints on ${inbound.host}:${inbound.port}`);
  const submission = await startSubmission(services);
  logger.info(`SMTP submission on ${config.smtpSubmission.host}:${submission.port} (docs/smtp.md)`);
  // Started before the stop is registered, so that a signal remembered from start-up finds it.
  const starting = startWorkerProcess(services);
  let stopping = false;
  shutdown.onStop(async () => {
    stopping = true;
    await submission.close();
    await app.close();
    await inbound.close();
    // Workers still starting are waited for while Redis answers (they are about to take jobs,
    // and are closed as running ones are: their jobs finish); while it is unreachable they wait
    // for it and have taken nothing, and the services are closed under them.
    const workers = services.redis.status === 'ready' ? await starting.catch(() => undefined) : undefined;
    await workers?.close();
    await closeServices(services);
  });
  try {
    await starting;
  } catch (error) {
    // A start cut short by the stop (its Redis connection closed under it) is no failure.
    if (stopping) return;
    throw error;
  }
  if (stopping) return;
  logger.info(`mailroom is running on http://${where} (docs at /docs)`);
}
await startAll();

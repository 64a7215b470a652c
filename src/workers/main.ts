import { pathToFileURL } from 'node:url';
import { bootConfig, handleShutdown } from '../shared/boot.js';
import { closeServices, createServices, type Services } from '../shared/container.js';
import { keepPlannerStatistics } from '../shared/db/planner-statistics.js';
import { createRedis } from '../shared/redis.js';
import { ensureWritableDirectory } from '../shared/startup.js';
import { processors } from './index.js';
import { startConfiguredMetricsServer, type MetricsServer } from './metrics-server.js';
import { startWorkers, type RunningWorkers } from './runner.js';

export async function startWorkerProcess(
  services: Services,
): Promise<{ running: RunningWorkers; metricsServer?: MetricsServer; close(): Promise<void> }> {
  // The file transport's directory: one it cannot write would fail every email, attempt after attempt.
  if (services.config.mail.transport === 'file') await ensureWritableDirectory(services.config.mail.outboxDir, 'MAIL_OUTBOX_DIR');
  // Health and metrics first: while Redis is unreachable the workers wait for it, and
  // meanwhile /healthz answers (the process is alive) and /readyz says why it is not ready.
  let running: RunningWorkers | undefined;
  const metricsServer = await startConfiguredMetricsServer(services, () => running?.paused ?? true);
  const connection = createRedis(services.config.redisUrl, 'worker');
  connection.on('error', (error) => services.logger.debug({ err: error }, 'worker redis error'));
  try {
    running = await startWorkers(services, connection, processors, services.config.workerQueues);
  } catch (error) {
    await metricsServer?.close();
    connection.disconnect();
    throw error;
  }
  const workers = running;
  services.logger.info({ queues: workers.queues }, 'workers started');
  // Fast-growing tables are analysed before their prepared statements' plans go stale.
  const statistics = keepPlannerStatistics(services.orm, services.logger);
  return {
    running: workers,
    metricsServer,
    async close() {
      await statistics.stop();
      await metricsServer?.close();
      await workers.close();
      connection.disconnect();
    },
  };
}

// `npm run start:worker` (Procfile `worker`): the queues named in WORKER_QUEUES, or all.
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { config, logger } = bootConfig('mailroom-worker');
  const shutdown = handleShutdown(logger);
  const services = await createServices(config, logger);
  const workers = await startWorkerProcess(services);
  shutdown.onStop(async () => {
    await workers.close();
    await closeServices(services);
  });
}

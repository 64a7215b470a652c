import { pathToFileURL } from 'node:url';
import { bootConfig, handleShutdown } from '../shared/boot.js';
import { closeServices, createServices } from '../shared/container.js';
import { startConfiguredMetricsServer } from '../workers/metrics-server.js';
import { startSubmission } from './server.js';

// `npm run start:smtp` (Procfile `smtp`): the SMTP submission listener alone. Any number
// of them may run beside the API and workers: they share PostgreSQL and Redis only.
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { config, logger } = bootConfig('mailroom-smtp');
  const shutdown = handleShutdown(logger);
  const services = await createServices(config, logger);
  const listener = await startSubmission(services);
  logger.info({ port: listener.port, tlsPort: listener.tlsPort }, `SMTP submission listening on ${config.smtpSubmission.host}:${listener.port}`);
  // /healthz, /readyz and this process's metrics (the emails it accepted), as a worker serves them.
  const metrics = await startConfiguredMetricsServer(services, () => false);
  shutdown.onStop(async () => {
    await listener.close();
    await metrics?.close();
    await closeServices(services);
  });
}

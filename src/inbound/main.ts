import { pathToFileURL } from 'node:url';
import { bootConfig, handleShutdown } from '../shared/boot.js';
import { closeServices, createServices } from '../shared/container.js';
import { startConfiguredMetricsServer } from '../workers/metrics-server.js';
import { startInbound } from './server.js';

// `npm run start:inbound` (Procfile `inbound`): the SMTP listener for bounces and complaints
// (INBOUND_SMTP_HOST / INBOUND_SMTP_PORT). It stores reports and enqueues them; a `worker`
// process (queue `inbound`) reads them.
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { config, logger } = bootConfig('mailroom-inbound');
  const shutdown = handleShutdown(logger);
  const services = await createServices(config, logger);
  const inbound = await startInbound(services);
  logger.info(`inbound SMTP listening on ${inbound.host}:${inbound.port}`);
  // /healthz, /readyz and this process's metrics (its refused recipients), as a worker serves them.
  const metrics = await startConfiguredMetricsServer(services, () => false);
  shutdown.onStop(async () => {
    await inbound.close();
    await metrics?.close();
    await closeServices(services);
  });
}

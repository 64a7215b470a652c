import { pathToFileURL } from 'node:url';
import { bootConfig, handleShutdown } from '../shared/boot.js';
import { closeServices, createServices, type Services } from '../shared/container.js';
import { listenOrExplain } from '../shared/startup.js';
import { buildApp } from './app.js';
import type { App } from './types.js';

/** Starts the API on HOST:PORT with the given services; returns the listening app. */
export async function startApi(services: Services): Promise<App> {
  const app = await buildApp(services, { logRequests: services.config.logLevel === 'debug' || services.config.logLevel === 'trace' });
  const { host, port } = services.config;
  await listenOrExplain(() => app.listen({ host, port }), { variable: 'HOST', value: host }, { variable: 'PORT', value: port });
  return app;
}

// `npm run start:api` (Procfile `web`): the API alone.
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { config, logger } = bootConfig('mailroom-api');
  const shutdown = handleShutdown(logger);
  const services = await createServices(config, logger);
  const app = await startApi(services);
  shutdown.onStop(async () => {
    await app.close();
    await closeServices(services);
  });
}

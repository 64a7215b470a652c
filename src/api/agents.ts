import type { Services } from '../shared/container.js';
import type { WindowRateLimiter } from '../shared/rate-limits/window.js';
import type { TokenCache } from '../shared/tokens/token-cache.js';
import { callerHook } from './tools/caller-hook.js';
import { mcpRoutes } from './tools/mcp.js';
import { toolCatalogRoutes, toolRunRoutes } from './tools/routes.js';
import type { App } from './types.js';
import { v1Routes } from './v1/routes.js';

/**
 * The layers over the v2 endpoints (docs/agents.md): the tool catalog and runner, the MCP
 * server and the frozen v1 interface. All of them answer by dispatching v2 requests, so they
 * authenticate here but leave the rate limit and quota to the endpoint, and its permission
 * too, but for a route of theirs that validates its own input: its config names the twin's
 * permission, checked first (caller-hook.ts).
 */
export async function registerAgentInterfaces(app: App, services: Services, tokenCache: TokenCache, rateLimiter: WindowRateLimiter): Promise<void> {
  await app.register(
    async (scope) => {
      scope.addHook('onRequest', callerHook(services, tokenCache, rateLimiter, { counted: true }));
      await scope.register(toolCatalogRoutes);
    },
    { prefix: '/api/v2' },
  );
  await app.register(
    async (scope) => {
      scope.addHook('onRequest', callerHook(services, tokenCache, rateLimiter, { counted: false }));
      await scope.register(toolRunRoutes);
    },
    { prefix: '/api/v2' },
  );
  await app.register(async (scope) => {
    scope.addHook('onRequest', callerHook(services, tokenCache, rateLimiter, { counted: false }));
    await scope.register(mcpRoutes(rateLimiter));
  });
  await app.register(
    async (scope) => {
      scope.addHook('onRequest', callerHook(services, tokenCache, rateLimiter, { counted: false }));
      await scope.register(v1Routes);
    },
    { prefix: '/api/v1' },
  );
}

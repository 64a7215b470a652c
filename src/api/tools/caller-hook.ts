import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Services } from '../../shared/container.js';
import type { WindowRateLimiter } from '../../shared/rate-limits/window.js';
import type { TokenCache } from '../../shared/tokens/token-cache.js';
import { assertRoutePermission, authenticate, limitOrganization, rateLimit, refuseThrottledToken } from '../plugins/auth.js';

/**
 * onRequest hook of the layers that dispatch v2 requests in-process (tool runner, MCP, v1):
 * the bearer token is checked first (401 `missing_api_key` before anything else), but the
 * request is not counted against the rate limit here, because every endpoint request it
 * dispatches is counted by the endpoint itself: one tool call or one v1 call is one request.
 * Pass `counted: true` for routes of these layers that dispatch nothing (the tool list).
 * The organization's limit is counted here for every request, before anything is
 * dispatched, so a call refused by the layer itself (bad arguments) costs the same. A route
 * that names a permission in its config (a v1 path validating its own input) is refused 403
 * here without it, before its validation, as v2 orders them.
 */
export function callerHook(services: Services, cache: TokenCache, limiter: WindowRateLimiter, options: { counted: boolean }) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    // No route matched: the scope's own 404, with or without a token (routing comes before authentication).
    if (request.is404) return;
    request.caller = await authenticate(services, cache, request);
    // The token's limit first, as on v2: a request it refuses does not spend the organization's budget.
    if (options.counted) await rateLimit(limiter, request.caller, reply);
    else refuseThrottledToken(limiter, request.caller);
    await limitOrganization(services, request.caller);
    // A route of these layers that validates its own input names its v2 twin's permission:
    // checked before that validation, as v2 does (the twin would check it too, but after).
    assertRoutePermission(request);
  };
}

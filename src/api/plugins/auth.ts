import type { EntityManager } from '@mikro-orm/postgresql';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Services } from '../../shared/container.js';
import { limitExceeded, limitHeaders, type RateDecision, type WindowRateLimiter } from '../../shared/rate-limits/window.js';
import { AuthenticationError, PermissionError } from '../../shared/errors.js';
import { holds } from '../../shared/tokens/permissions.js';
import { findTokenBySecret, type Caller } from '../../shared/tokens/service.js';
import type { TokenCache } from '../../shared/tokens/token-cache.js';
import { organizationLimitPaid } from '../tools/dispatch.js';

export type { RateDecision } from '../../shared/rate-limits/window.js';

function bearer(request: FastifyRequest): string | undefined {
  const header = request.headers.authorization;
  if (!header) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}

/**
 * The token a secret belongs to, through the process's cache; null when there is none.
 * The one lookup of every way in with a token (HTTP API, SMTP submission).
 */
export async function callerForSecret(em: EntityManager, cache: TokenCache, secret: string): Promise<Caller | null> {
  const entry = cache.get(secret);
  if (entry) return entry.caller;
  const generation = cache.current;
  const token = await findTokenBySecret(em, secret);
  const caller = token ? { organizationId: token.organizationId, tokenId: token.id, permissions: token.permissions } : null;
  cache.set(secret, caller, generation);
  return caller;
}

export async function authenticate(services: Services, cache: TokenCache, request: FastifyRequest): Promise<Caller> {
  const secret = bearer(request);
  if (!secret) throw new AuthenticationError();
  const caller = await callerForSecret(request.em, cache, secret);
  if (!caller) throw new AuthenticationError('Missing or invalid API key', 'invalid_token');
  return caller;
}

const tokenLimitExceeded = (decision: RateDecision) =>
  limitExceeded(decision, `More than ${decision.limit} requests a second with this token; retry after ${decision.resetSeconds} s`);

export async function rateLimit(limiter: WindowRateLimiter, caller: Caller, reply: FastifyReply): Promise<void> {
  const decision = await limiter.take(caller.tokenId);
  void reply.headers(limitHeaders(decision));
  if (!decision.allowed) throw tokenLimitExceeded(decision);
}

/**
 * The token's 429 when its limit is known to refuse it this second, counting nothing: for the
 * layers whose endpoint counts the token (tools, MCP, v1), before they count the organization,
 * so a throttled token does not spend its siblings' budget there either.
 */
export function refuseThrottledToken(limiter: WindowRateLimiter, caller: Caller): void {
  const refusal = limiter.refusing(caller.tokenId);
  if (refusal) throw tokenLimitExceeded(refusal);
}

/**
 * One request of the caller's organization against RATE_LIMIT_ORG_PER_SECOND. Counted once
 * per request that reaches the service from outside: by the v2 hook, and by the layers that
 * dispatch (tools, MCP, v1) before they dispatch, so a call they refuse themselves counts
 * too; the first v2 request they dispatch is not counted again, every further one is
 * (organizationLimitPaid).
 */
export async function limitOrganization(services: Pick<Services, 'orgLimiter'>, caller: Caller): Promise<void> {
  const decision = await services.orgLimiter.take(caller.organizationId);
  // Refused by this limit: the answer's RateLimit-* headers are the organization's (the binding one).
  if (!decision.allowed) throw limitExceeded(decision, `More than ${decision.limit} requests a second for this organization; retry after ${decision.resetSeconds} s`);
}

/**
 * onRequest hook of every authenticated scope: token, then rate limits, then permission. The
 * token's own limit first: a request it refuses does not spend the organization's budget, or
 * one runaway token, while throttled, would lock out every other token of its organization.
 */
export function authHook(services: Services, cache: TokenCache, limiter: WindowRateLimiter) {
  return async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    request.caller = await authenticate(services, cache, request);
    await rateLimit(limiter, request.caller, reply);
    if (!organizationLimitPaid(request)) await limitOrganization(services, request.caller);
    assertRoutePermission(request);
  };
}

/** The route's permission (its config), held by the caller or 403 under the route's error name. */
export function assertRoutePermission(request: FastifyRequest): void {
  const permission = request.routeOptions.config?.permission;
  if (permission && !holds(request.caller.permissions, permission)) {
    throw new PermissionError(`This token lacks the "${permission}" permission`, request.routeOptions.config.permissionErrorName ?? 'missing_permission');
  }
}

import type { FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import type { Services } from '../../shared/container.js';
import { PermissionError, ValidationError } from '../../shared/errors.js';
import { holds, type Permission } from '../../shared/tokens/permissions.js';
import type { Caller } from '../../shared/tokens/service.js';
import type { TokenCache } from '../../shared/tokens/token-cache.js';
import type { SafeHtml, PageUser } from './html.js';
import type { ImportTracker } from './imports.js';
import type { Session, SessionStore } from './session.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by the dashboard's session hook on its signed-in pages. */
    dashboard: { sessionId: string; session: Session; caller: Caller; user: PageUser } | null;
  }
}

export interface DashboardContext {
  services: Services;
  sessions: SessionStore;
  /** The API's token cache of this process: a revoked token is dropped from it at once. */
  tokenCache: TokenCache;
  imports: ImportTracker;
}

/** The signed-in person, as the API's services see a caller (organization and permissions). */
export function signedIn(request: FastifyRequest, permission?: Permission): NonNullable<FastifyRequest['dashboard']> {
  const current = request.dashboard;
  if (!current) throw new PermissionError('Sign in first');
  // The same check as the API's auth hook. A dashboard user holds every permission of
  // their organization today (docs/dashboard.md); the check stays for roles to come.
  if (permission && !holds(current.caller.permissions, permission)) {
    throw new PermissionError(`Your account lacks the "${permission}" permission`);
  }
  return current;
}

export function sendPage(reply: FastifyReply, body: SafeHtml, status = 200): FastifyReply {
  return reply.code(status).header('content-type', 'text/html; charset=utf-8').header('cache-control', 'no-store').send(body.value);
}

/** Form fields as strings (a repeated field keeps its last value). */
export function formOf(request: FastifyRequest): Record<string, string> {
  const body = (request.body ?? {}) as Record<string, unknown>;
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(body)) {
    const last = Array.isArray(value) ? value[value.length - 1] : value;
    if (typeof last === 'string') out[key] = last;
  }
  return out;
}

/** A string field that is absent or blank is left out (undefined), as an API body would omit it. */
export function optional(value: string | undefined): string | undefined {
  const trimmed = value?.trim();
  return trimmed ? trimmed : undefined;
}

/** A page's query string (`?a=1&b=2`, or '' when every value is blank), for pager and filter links. */
export function query(params: Record<string, string | undefined>): string {
  const kept = Object.entries(params).filter(([, v]) => v);
  return kept.length ? `?${new URLSearchParams(kept as [string, string][]).toString()}` : '';
}

/** Parses with one of the API's schemas; a failure is the API's validation error. */
export function parseWith<S extends z.ZodType>(schema: S, data: unknown, status = 422): z.infer<S> {
  const result = schema.safeParse(data);
  if (result.success) return result.data;
  const details = result.error.issues.map((i) => ({ path: i.path.join('.') || 'body', message: i.message }));
  throw new ValidationError(details.map((d) => `${d.path}: ${d.message}`).join('; '), details, status);
}

// Fixed messages shown after a redirect (?notice=KEY): nothing from the URL is echoed.
export const NOTICES: Record<string, string> = {
  saved: 'Saved.',
  created: 'Created.',
  token_created: 'Token created.',
  webhook_created: 'Endpoint added.',
  scheduled: 'The campaign is scheduled.',
  test_sent: 'The test email is on its way.',
  verifying: 'Verification requested: the DNS records are being checked.',
  revoked: 'The token is revoked: the API refuses it from now on.',
  tag_added: 'Tag added.',
  tag_removed: 'Tag removed.',
  sender_added: 'Sender added.',
  webhook_deleted: 'The endpoint is deleted, with its deliveries.',
  webhook_test: 'A test event is queued for the endpoint: it appears below, and is sent within seconds.',
  webhook_retry: 'The delivery is due again now: it is sent within seconds.',
  signed_out: 'You are signed out.',
  expired: 'Your session has expired: sign in again.',
};

/** The `shown` query parameter: the id of a secret a form post kept for this page (SessionStore#keepToShow). */
export function shownOf(request: FastifyRequest): string | undefined {
  const id = (request.query as Record<string, unknown> | undefined)?.shown;
  return typeof id === 'string' ? id : undefined;
}

export function noticeOf(request: FastifyRequest): string | undefined {
  const key = (request.query as Record<string, unknown> | undefined)?.notice;
  return typeof key === 'string' ? NOTICES[key] : undefined;
}

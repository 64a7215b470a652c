import { randomBytes } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { errorBody } from '../plugins/errors.js';
import type { App } from '../types.js';

/** A v2 request a tool or a v1 path stands for. */
export interface EndpointRequest {
  method: 'GET' | 'POST' | 'PATCH' | 'DELETE';
  /** Path under the server root, path parameters already URL-encoded. */
  url: string;
  body?: unknown;
  query?: Record<string, string | number | boolean | undefined>;
  /** Request headers of the endpoint beyond the caller's own; only `FORWARDABLE_HEADERS`. */
  headers?: Partial<Record<ForwardableHeader, string>>;
}

/**
 * The only headers a tool or a v1 path may add to the request it dispatches. Everything
 * else is set here (`authorization`, `x-request-id`, `content-type`), after these, so no
 * tool argument or client value can run the endpoint under another token or identity.
 */
export const FORWARDABLE_HEADERS = ['idempotency-key'] as const;
export type ForwardableHeader = (typeof FORWARDABLE_HEADERS)[number];

export interface EndpointResponse {
  statusCode: number;
  /** The endpoint's JSON body (`null` when it sent none). */
  body: unknown;
  headers: Record<string, string>;
}

/**
 * Marks every request this process dispatches, with one of two random values of this
 * process (a client cannot send either, and dispatch never forwards a client's value):
 * - PAID on an outer request's first dispatch. The organization's rate limit counts the outer
 *   request when it arrives (auth.ts limitOrganization), which pays for that one; every
 *   further one (the calls of an MCP batch after the first, the pages a v1 `page` walks) is
 *   counted on its own, so a batch cannot multiply an organization's budget.
 * - UNPAID on the others.
 * Either way the HTTP metrics count the client's request once, not its dispatches again.
 */
const DISPATCH_HEADER = 'x-mailroom-dispatch';
const PAID = randomBytes(16).toString('hex');
const UNPAID = randomBytes(16).toString('hex');
// Set on an outer request once it has dispatched its first request.
const DISPATCHED = Symbol('dispatched');

/** Whether `request` was dispatched by this process (a tool's, a v1 path's or an MCP call's v2 request). */
export function isDispatched(request: FastifyRequest): boolean {
  const mark = request.headers[DISPATCH_HEADER];
  return mark === PAID || mark === UNPAID;
}

/** Whether the organization's limit was already counted for this request (its outer request's first). */
export function organizationLimitPaid(request: FastifyRequest): boolean {
  return request.headers[DISPATCH_HEADER] === PAID;
}

// Response headers a caller of the outer layer still needs (rate limit, retry hints, a 405's Allow).
const FORWARDED_HEADERS = ['retry-after', 'ratelimit-limit', 'ratelimit-remaining', 'ratelimit-reset', 'allow'];

/**
 * Runs `target` as the v2 endpoint itself, in-process (`app.inject`), with the caller's own
 * `Authorization` header: authentication, permission, rate limit, validation, errors and
 * quotas are exactly the endpoint's, because it is the endpoint that answers.
 */
export async function dispatch(app: App, from: FastifyRequest, target: EndpointRequest): Promise<EndpointResponse> {
  if (hasDotSegment(target.url)) {
    // `app.inject` resolves `.` and `..` like a browser: `/subscribers/../tags` would run
    // another endpoint than the one the tool or the v1 path stands for. No id is `.` or `..`.
    return { statusCode: 404, body: errorBody(404, 'not_found', 'No resource is named "." or ".."'), headers: {} };
  }
  const headers: Record<string, string> = {};
  for (const name of FORWARDABLE_HEADERS) {
    const value = target.headers?.[name];
    if (value !== undefined) headers[name] = value;
  }
  // Set last, whatever the target asked for: the endpoint runs as the caller, and only as the caller.
  headers['x-request-id'] = from.id;
  const outer = from as FastifyRequest & { [DISPATCHED]?: true };
  headers[DISPATCH_HEADER] = outer[DISPATCHED] ? UNPAID : PAID;
  outer[DISPATCHED] = true;
  if (from.headers.authorization) headers.authorization = from.headers.authorization;
  if (target.body !== undefined) headers['content-type'] = 'application/json';
  const query: Record<string, string> = {};
  for (const [name, value] of Object.entries(target.query ?? {})) if (value !== undefined) query[name] = String(value);

  const response = await app.inject({
    method: target.method,
    url: target.url,
    query,
    headers,
    ...(target.body === undefined ? {} : { payload: JSON.stringify(target.body) }),
  });

  const forwarded: Record<string, string> = {};
  for (const name of FORWARDED_HEADERS) {
    const value = response.headers[name];
    if (value !== undefined) forwarded[name] = String(value);
  }
  return { statusCode: response.statusCode, body: response.body ? parseJson(response.body) : null, headers: forwarded };
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** Whether a path has a `.` or `..` segment, literally or percent-encoded (`%2e`). */
function hasDotSegment(url: string): boolean {
  const path = url.split('?')[0] ?? '';
  return path.split('/').some((part) => /^(?:\.|%2e){1,2}$/i.test(part));
}

/**
 * `encodeURIComponent` for one path segment. An unpaired surrogate (which it cannot encode)
 * becomes U+FFFD: the segment then names no resource, and the endpoint answers its 404.
 */
export function segment(value: string): string {
  return encodeURIComponent(String(value).toWellFormed());
}

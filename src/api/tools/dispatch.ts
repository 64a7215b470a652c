import type { FastifyRequest } from 'fastify';
import type { App } from '../types.js';

/** A v2 request a tool or a v1 path stands for. */
export interface EndpointRequest {
  method: 'GET' | 'POST' | 'PATCH' | 'DELETE';
  /** Path under the server root, path parameters already URL-encoded. */
  url: string;
  body?: unknown;
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string | undefined>;
}

export interface EndpointResponse {
  statusCode: number;
  /** The endpoint's JSON body (`null` when it sent none). */
  body: unknown;
  headers: Record<string, string>;
}

// Response headers a caller of the outer layer still needs (rate limit, retry hints).
const FORWARDED_HEADERS = ['retry-after', 'ratelimit-limit', 'ratelimit-remaining', 'ratelimit-reset'];

/**
 * Runs `target` as the v2 endpoint itself, in-process (`app.inject`), with the caller's own
 * `Authorization` header: authentication, permission, rate limit, validation, errors and
 * quotas are exactly the endpoint's, because it is the endpoint that answers.
 */
export async function dispatch(app: App, from: FastifyRequest, target: EndpointRequest): Promise<EndpointResponse> {
  const headers: Record<string, string> = { 'x-request-id': from.id };
  if (from.headers.authorization) headers.authorization = from.headers.authorization;
  for (const [name, value] of Object.entries(target.headers ?? {})) if (value !== undefined) headers[name] = value;
  const query: Record<string, string> = {};
  for (const [name, value] of Object.entries(target.query ?? {})) if (value !== undefined) query[name] = String(value);

  const response = await app.inject({
    method: target.method,
    url: target.url,
    query,
    headers,
    ...(target.body === undefined ? {} : { payload: JSON.stringify(target.body), headers: { ...headers, 'content-type': 'application/json' } }),
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

/** `encodeURIComponent` for one path segment. */
export function segment(value: string): string {
  return encodeURIComponent(value);
}

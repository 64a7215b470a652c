import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { errorBody, errorHandler } from '../plugins/errors.js';
import { wholeNumberQuery } from '../schemas.js';
import { dispatch, segment, type EndpointRequest, type EndpointResponse } from '../tools/dispatch.js';
import type { App } from '../types.js';
import type { Permission } from '../../shared/tokens/permissions.js';
import { sendWrapped, v1Error } from './envelope.js';

/**
 * The frozen v1 interface (docs/agents.md "The frozen v1 interface"): each path is its v2 twin
 * answered in-process, with the v1 envelope around it. Mirrored paths are one line of `MIRRORED`;
 * only send-email and the list pagination translate anything (docs/agents.md).
 */
interface Mirror {
  method: 'GET' | 'POST' | 'PATCH' | 'DELETE';
  /** v1 path under /api/v1 (Fastify pattern). */
  path: string;
  /** v2 path under /api/v2 when it differs. */
  v2?: string;
  /**
   * `cursor`: a v2 cursor list, v1 `page`/`cursor`/`limit` become v2 `after`/`limit`.
   * `all`: v2 answers the whole list (tags); v1 pages it the same way in memory.
   */
  list?: 'cursor' | 'all';
  /**
   * The v2 twin's permission, for a path v1 validates itself (its list query): checked first,
   * so a token without it gets the twin's 403 before any 422 of v1's own (docs/agents.md).
   */
  permission?: Permission;
}

const MIRRORED: Mirror[] = [
  { method: 'POST', path: '/emails/verify', v2: '/verify' },
  { method: 'POST', path: '/verify' },
  { method: 'POST', path: '/subscribers' },
  { method: 'GET', path: '/subscribers', list: 'cursor', permission: 'subscribers' },
  { method: 'GET', path: '/subscribers/:subscriber' },
  { method: 'PATCH', path: '/subscribers/:subscriber' },
  // Disabled as on v2: its 405 method_not_allowed, with Allow (docs/foundation.md "Errors"), not an unknown path's 404.
  { method: 'DELETE', path: '/subscribers/:subscriber' },
  { method: 'POST', path: '/subscribers/:subscriber/unsubscribe' },
  { method: 'POST', path: '/subscribers/:subscriber/tags' },
  { method: 'DELETE', path: '/subscribers/:subscriber/tags' },
  { method: 'GET', path: '/subscribers/:subscriber/events', list: 'cursor', permission: 'subscribers' },
  { method: 'POST', path: '/events' },
  { method: 'GET', path: '/tags', list: 'all', permission: 'audience' },
  { method: 'POST', path: '/tags' },
  { method: 'GET', path: '/tags/:tag' },
  { method: 'GET', path: '/campaigns', list: 'cursor', permission: 'campaigns' },
  { method: 'POST', path: '/campaigns' },
  { method: 'GET', path: '/campaigns/:campaignId' },
  { method: 'PATCH', path: '/campaigns/:campaignId' },
  { method: 'DELETE', path: '/campaigns/:campaignId' },
  { method: 'POST', path: '/campaigns/:campaignId/send' },
];

const DEFAULT_PAGE_SIZE = 20;
const MAX_PAGE_SIZE = 100;

const ListQuery = z.looseObject({
  page: wholeNumberQuery(1).optional().describe('1-based page of `limit` items, counted from `cursor` (or the start)'),
  cursor: z.string().min(1).optional().describe('Id of the last item already seen: v2 `after`'),
  limit: wholeNumberQuery(1, MAX_PAGE_SIZE).optional(),
});

// The v2 fields a v1 send was translated into, by the v1 field the caller wrote.
const V1_FIELD: Record<string, string> = { markdown: 'content', html: 'content', tiptap: 'content', reply_to: 'replyTo' };
/** v1 send: `content` + `contentType` and `replyTo`; everything else as v2 takes it. */
export const V1SendBody = z.looseObject({
  content: z.union([z.string(), z.record(z.string(), z.unknown())]),
  contentType: z.enum(['MARKDOWN', 'HTML', 'TIPTAP']).default('MARKDOWN'),
  replyTo: z.union([z.string(), z.array(z.string())]).optional(),
  // v1 accepted a tracking switch; v2 dropped it (tracking follows the organization).
  tracking: z.unknown().optional(),
  // The v2 names of the translated fields: refused, not silently overwritten by the translation
  // (and the errors of the v2 fields they become name the v1 ones: inV1Fields).
  ...Object.fromEntries(
    Object.keys(V1_FIELD).map((field) => [field, z.never({ error: `is a v2 field: v1 takes ${V1_FIELD[field]}${V1_FIELD[field] === 'content' ? ' with contentType' : ''}` }).optional()]),
  ),
});

const CONTENT_FIELD = { MARKDOWN: 'markdown', HTML: 'html', TIPTAP: 'tiptap' } as const;

const V2_FIELD = new RegExp(`^(${Object.keys(V1_FIELD).join('|')})(?=[.:]|$)`);

/** A v2 error about a translated field, in the v1 names the caller used (`content: …`, not `markdown: …`). */
function inV1Fields(response: EndpointResponse, rename: (text: string) => string = (text) => text.replace(V2_FIELD, (field) => V1_FIELD[field]!)): EndpointResponse {
  const body = response.body as { message?: unknown; details?: Array<{ path: string; message: string }> } | null;
  if (response.statusCode < 400 || !body || typeof body.message !== 'string') return response;
  return {
    ...response,
    body: { ...body, message: rename(body.message), ...(body.details ? { details: body.details.map((d) => ({ ...d, path: rename(d.path) })) } : {}) },
  };
}

function v2Url(pattern: string, params: unknown): string {
  const values = (params ?? {}) as Record<string, string>;
  return `/api/v2${pattern.replace(/:(\w+)/g, (_match, key: string) => segment(values[key] ?? ''))}`;
}

interface Page {
  items: Array<{ id?: unknown }>;
  hasMore: boolean;
}

function asPage(body: unknown): Page {
  const envelope = (body ?? {}) as { data?: unknown; has_more?: unknown };
  return { items: Array.isArray(envelope.data) ? envelope.data : [], hasMore: envelope.has_more === true };
}

/** A v2 list's error about its `after` cursor, in the name the v1 caller used: `cursor`. */
const cursorInV1 = (response: EndpointResponse) => inV1Fields(response, (text) => text.replace(/^after(?=[.:]|$)/, 'cursor'));

/**
 * v1 `page` over v2 cursors: the items before the page are skipped by walking `after`
 * cursors in requests of up to 100 items, then the page itself is one request of `limit`.
 */
async function forwardList(app: App, request: FastifyRequest, reply: FastifyReply, url: string) {
  const { page = 1, cursor, limit = DEFAULT_PAGE_SIZE, ...filters } = ListQuery.parse(request.query);
  const query = filters as Record<string, string | undefined>;
  let after = cursor;
  let skip = (page - 1) * limit;
  while (skip > 0) {
    const take = Math.min(MAX_PAGE_SIZE, skip);
    const response = await dispatch(app, request, { method: 'GET', url, query: { ...query, limit: take, after } });
    if (response.statusCode >= 400) return sendWrapped(reply, cursorInV1(response));
    const { items, hasMore } = asPage(response.body);
    const last = items.at(-1);
    if (!hasMore || !last || typeof last.id !== 'string') {
      return sendWrapped(reply, { ...response, body: [] }, { pagination: { page, limit, hasMore: false, nextCursor: null } });
    }
    after = last.id;
    skip -= take;
  }
  const response = await dispatch(app, request, { method: 'GET', url, query: { ...query, limit, after } });
  if (response.statusCode >= 400) return sendWrapped(reply, cursorInV1(response));
  const { items, hasMore } = asPage(response.body);
  const last = items.at(-1);
  const nextCursor = hasMore && last && typeof last.id === 'string' ? last.id : null;
  return sendWrapped(reply, { ...response, body: items }, { pagination: { page, limit, hasMore, nextCursor } });
}

/** The same `page`/`cursor`/`limit` over a v2 list that answers everything at once. */
async function forwardWholeList(app: App, request: FastifyRequest, reply: FastifyReply, url: string) {
  const { page = 1, cursor, limit = DEFAULT_PAGE_SIZE, ...filters } = ListQuery.parse(request.query);
  const response = await dispatch(app, request, { method: 'GET', url, query: filters as Record<string, string | undefined> });
  if (response.statusCode >= 400) return sendWrapped(reply, response);
  const { items } = asPage(response.body);
  const at = cursor === undefined ? -1 : items.findIndex((item) => item.id === cursor);
  // As the v2 lists answer a cursor they do not know (docs/foundation.md): not page one again.
  if (cursor !== undefined && at < 0) {
    const message = `no item ${cursor} in this list`;
    return sendWrapped(reply, { statusCode: 422, headers: response.headers, body: errorBody(422, 'validation_error', `cursor: ${message}`, [{ path: 'cursor', message }]) });
  }
  const start = at + 1;
  const from = start + (page - 1) * limit;
  const pageItems = items.slice(from, from + limit);
  const hasMore = items.length > from + limit;
  const last = pageItems.at(-1);
  const nextCursor = hasMore && last && typeof last.id === 'string' ? last.id : null;
  return sendWrapped(reply, { ...response, body: pageItems }, { pagination: { page, limit, hasMore, nextCursor } });
}

function forwardedHeaders(request: FastifyRequest): EndpointRequest['headers'] {
  const key = request.headers['idempotency-key'];
  return { 'idempotency-key': typeof key === 'string' ? key : undefined };
}

export async function v1Routes(app: App): Promise<void> {
  app.setErrorHandler(errorHandler(v1Error));
  app.setNotFoundHandler((request, reply) =>
    reply.code(404).send(v1Error(errorBody(404, 'not_found', `No route ${request.method} ${request.url.split('?')[0]}`))),
  );

  for (const mirror of MIRRORED) {
    app.route({
      method: mirror.method,
      url: mirror.path,
      schema: { hide: true, ...(mirror.list ? { querystring: ListQuery } : {}) },
      ...(mirror.permission ? { config: { permission: mirror.permission } } : {}),
      handler: async (request, reply) => {
        const url = v2Url(mirror.v2 ?? mirror.path, request.params);
        if (mirror.list === 'cursor') return forwardList(app, request, reply, url);
        if (mirror.list === 'all') return forwardWholeList(app, request, reply, url);
        const target: EndpointRequest = { method: mirror.method, url, body: request.body ?? undefined };
        return sendWrapped(reply, await dispatch(app, request, target));
      },
    });
  }

  app.post('/emails', { schema: { hide: true, body: V1SendBody }, config: { permission: 'emails' } }, async (request, reply) => {
    const { content, contentType, replyTo, tracking: _dropped, ...rest } = request.body;
    const body = { ...rest, [CONTENT_FIELD[contentType]]: content, ...(replyTo === undefined ? {} : { reply_to: replyTo }) };
    const response = await dispatch(app, request, { method: 'POST', url: '/api/v2/emails', body, headers: forwardedHeaders(request) });
    return sendWrapped(reply, inV1Fields(response));
  });
}

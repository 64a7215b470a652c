import type { Duplex } from 'node:stream';
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { hasZodFastifySchemaValidationErrors, isResponseSerializationError } from 'fastify-type-provider-zod';
import { isDependencyDown } from '../../shared/dependency-errors.js';
import { AppError, AuthenticationError, NotFoundError, type ErrorDetail } from '../../shared/errors.js';
import { unstorableError, unstorablePath } from '../../shared/storable.js';
import type { App } from '../types.js';

export interface ErrorBody {
  name: string;
  message: string;
  statusCode: number;
  details?: ErrorDetail[];
}

export function errorBody(statusCode: number, name: string, message: string, details?: ErrorDetail[]): ErrorBody {
  return details ? { name, message, statusCode, details } : { name, message, statusCode };
}

/** The code of a JSON body that is not UTF-8 (the API's JSON parser, app.ts). */
export const BODY_NOT_UTF8 = 'MAILROOM_ERR_BODY_NOT_UTF8';

// Fastify's own errors and the JSON parser's, by code, to the error names of docs/foundation.md "Errors".
const FASTIFY_ERRORS: Record<string, { status: number; name: string; message: string }> = {
  [BODY_NOT_UTF8]: { status: 400, name: 'invalid_json', message: 'The body is not valid JSON: it is not UTF-8' },
  FST_ERR_CTP_INVALID_JSON_BODY: { status: 400, name: 'invalid_json', message: 'The body is not valid JSON' },
  FST_ERR_CTP_BODY_TOO_LARGE: { status: 413, name: 'payload_too_large', message: 'The body is larger than this endpoint accepts' },
  FST_ERR_CTP_INVALID_MEDIA_TYPE: { status: 415, name: 'unsupported_media_type', message: 'The body must be JSON (Content-Type: application/json)' },
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: { status: 400, name: 'invalid_json', message: 'The Content-Length does not match the body' },
  FST_ERR_CTP_INVALID_TYPE: { status: 415, name: 'unsupported_media_type', message: 'The body must be JSON (Content-Type: application/json)' },
};

function detailPath(context: string | undefined, instancePath: string): string {
  const path = instancePath.replace(/^\//, '').replace(/\//g, '.');
  if (context === 'querystring' || context === 'params' || context === 'headers') return path || context;
  return path || 'body';
}

/** The status of a route's validation errors: 422, or the 400 the spec gives some routes (`config.validationStatus`). */
export function validationStatusOf(request: FastifyRequest): number {
  return request.routeOptions.config?.validationStatus ?? 422;
}

/** The one error handler of the service: every failure leaves as the spec's error body. */
export function toErrorBody(error: unknown, request: FastifyRequest): ErrorBody {
  if (error instanceof AppError) return errorBody(error.statusCode, error.errorName, error.message, error.details);
  if (hasZodFastifySchemaValidationErrors(error)) {
    const status = validationStatusOf(request);
    const context = (error as { validationContext?: string }).validationContext;
    if (context === 'params') {
      // A path parameter names a resource: one that fails its schema (an id too long)
      // names none. docs/foundation.md "Errors": an unknown id, email, hostname or name is 404.
      const first = error.validation[0];
      return errorBody(404, 'not_found', `No resource at this path (${detailPath(context, first?.instancePath ?? '')}: ${first?.message ?? 'invalid'})`);
    }
    // An unknown field is named by its own path (zod reports the object holding it, with the keys).
    const details = error.validation.flatMap((v) => {
      const keys = v.keyword === 'unrecognized_keys' ? (v.params as { keys?: unknown }).keys : undefined;
      if (Array.isArray(keys) && keys.length > 0) {
        return keys.map((key) => ({ path: detailPath(context, `${v.instancePath.replace(/\/$/, '')}/${String(key)}`), message: `"${String(key)}" is not a field of this request (check its spelling)` }));
      }
      return [{ path: detailPath(context, v.instancePath), message: v.message ?? 'invalid' }];
    });
    const first = details[0];
    return errorBody(status, 'validation_error', first ? `${first.path}: ${first.message}` : 'Invalid request', details);
  }
  const code = (error as FastifyError).code;
  const known = code ? FASTIFY_ERRORS[code] : undefined;
  if (known) return errorBody(known.status, known.name, known.message);
  if ((error as FastifyError).statusCode === 400 && (error as SyntaxError).name === 'SyntaxError') {
    return errorBody(400, 'invalid_json', 'The body is not valid JSON');
  }
  if (isDependencyDown(error)) return errorBody(503, 'service_unavailable', 'A dependency of the service is unavailable; try again shortly');
  if (isResponseSerializationError(error)) return errorBody(500, 'internal_error', 'Internal error');
  const status = (error as FastifyError).statusCode;
  if (status && status >= 400 && status < 500) {
    // Another client error from Fastify itself (e.g. a malformed header).
    return errorBody(status, status === 404 ? 'not_found' : 'bad_request', (error as Error).message);
  }
  return errorBody(500, 'internal_error', 'Internal error');
}

/** `WWW-Authenticate` of a 401 of the API (RFC 6750 section 3): the bearer scheme and its realm. */
export const BEARER_REALM = 'mailroom';

export function bearerChallenge(error: AuthenticationError): string {
  return error.reason === 'invalid_token'
    ? `Bearer realm="${BEARER_REALM}", error="invalid_token", error_description="The API token is not valid"`
    : `Bearer realm="${BEARER_REALM}"`;
}

/** A 5xx is the service's problem: logged with the error (a 4xx is the caller's, and is not). */
function logServerError(request: FastifyRequest, error: unknown, body: ErrorBody): void {
  if (body.statusCode >= 500) request.log.error({ err: error }, body.statusCode === 503 ? 'dependency unavailable' : 'request failed');
}

/** The headers an error answer carries besides its body: the 401 challenge, the 503 retry hint. */
export function errorHeaders(error: unknown, body: ErrorBody, reply: FastifyReply): void {
  if (error instanceof AuthenticationError) void reply.header('WWW-Authenticate', bearerChallenge(error));
  if (body.statusCode === 503) void reply.header('Retry-After', '5');
  if (error instanceof AppError && error.headers) void reply.headers(error.headers);
}

function refuseNul(request: FastifyRequest, _reply: FastifyReply, done: (error?: Error) => void): void {
  if (unstorablePath(request.params, 'params')) return done(new NotFoundError('No resource has a name or id with a NUL character or an unpaired surrogate'));
  const where = unstorablePath(request.query, 'querystring') ?? (request.body === undefined ? undefined : unstorablePath(request.body, 'body'));
  if (!where) return done();
  done(unstorableError(where, validationStatusOf(request)));
}

/**
 * Fastify's router refuses a path before any route or hook sees it when a segment is not
 * valid percent-encoding (`%FF`, `%E0%A4%A`) or a parameter is longer than `maxParamLength`.
 * No resource is named by such a path: 404 `not_found` in the spec's shape
 * (docs/foundation.md "Errors"), rather than Fastify's own body.
 */
export function frameworkError(
  error: FastifyError,
  request: FastifyRequest,
  reply: FastifyReply,
  /** How the interface of that path wraps an error body (v1's envelope). */
  wrap: (body: ErrorBody) => unknown = (body) => body,
): void {
  const message =
    error.code === 'FST_ERR_MAX_PARAM_LENGTH'
      ? 'No resource has an identifier this long'
      : error.code === 'FST_ERR_BAD_URL'
        ? 'The path is not valid percent-encoding: no resource has this name'
        : 'Not found';
  void reply.code(404).header('x-request-id', request.id).send(wrap(errorBody(404, 'not_found', message)));
}

/**
 * The one error handler of an interface: the spec's body (a 5xx logged, its headers set),
 * wrapped as that interface answers errors (v1's envelope, MCP's JSON-RPC).
 */
export function errorHandler(wrap: (body: ErrorBody) => unknown = (body) => body) {
  return (error: Error, request: FastifyRequest, reply: FastifyReply) => {
    const body = toErrorBody(error, request);
    logServerError(request, error, body);
    errorHeaders(error, body, reply);
    return reply.code(body.statusCode).send(wrap(body));
  };
}

/**
 * A request Node's HTTP parser refuses before Fastify sees it (a raw non-ASCII byte in the
 * request line, a malformed header, a header section over the limit, a request that never
 * completes): answered in the spec's error body, as Fastify's default answers but in its own shape.
 */
export function clientErrorHandler(this: { log: { trace(obj: object, msg: string): void } }, error: NodeJS.ErrnoException, socket: Duplex): void {
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  const [status, text, body] = clientErrorAnswer(error.code);
  this.log.trace({ err: error }, 'client error');
  // Not in the middle of an answer already under way on this connection (Node's own check).
  const answering = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage?.headersSent === true;
  if (socket.writable && !answering) {
    const json = JSON.stringify(body);
    socket.write(`HTTP/1.1 ${status} ${text}\r\nContent-Length: ${Buffer.byteLength(json)}\r\nContent-Type: application/json; charset=utf-8\r\nConnection: close\r\n\r\n${json}`);
  }
  socket.destroy(error);
}

/** The status, reason phrase and body for a parser error code, as Node's default chooses the status. */
function clientErrorAnswer(code: string | undefined): [number, string, ErrorBody] {
  switch (code) {
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return [408, 'Request Timeout', errorBody(408, 'request_timeout', 'The request was not received in time')];
    case 'HPE_HEADER_OVERFLOW':
      return [431, 'Request Header Fields Too Large', errorBody(431, 'headers_too_large', 'The request headers are larger than this server accepts')];
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return [413, 'Payload Too Large', errorBody(413, 'payload_too_large', 'The chunk extensions of the body are larger than this server accepts')];
    case 'HPE_INVALID_CHUNK_SIZE':
    case 'HPE_UNEXPECTED_CONTENT_LENGTH':
    case 'HPE_INVALID_TRANSFER_ENCODING':
    case 'HPE_INVALID_CONTENT_LENGTH':
      return [400, 'Bad Request', errorBody(400, 'bad_request', "The request's body framing (Content-Length or Transfer-Encoding) is not valid HTTP")];
    default:
      return [400, 'Bad Request', errorBody(400, 'bad_request', 'The request is not valid HTTP: its URL must be percent-encoded (no raw character outside ASCII) and its headers well formed')];
  }
}

export function registerErrorHandling(app: App): void {
  app.setErrorHandler(errorHandler());
  // PostgreSQL text cannot hold U+0000 (nor jsonb an unpaired surrogate): such text anywhere in a path, query or body is refused
  // before the handler, in the spec's error shape, instead of failing deep in a query. Only
  // routes that take input get the check (after their own preValidation, so the provider
  // webhook still checks its signature first); /healthz and the like pay nothing.
  app.addHook('onRoute', (route) => {
    if (route.config?.acceptsNul) return;
    const schema = route.schema as { params?: unknown; querystring?: unknown; body?: unknown } | undefined;
    const takesInput = route.url.includes(':') || route.url.includes('*') || schema?.params || schema?.querystring || schema?.body;
    if (!takesInput) return;
    const own = route.preValidation === undefined ? [] : Array.isArray(route.preValidation) ? route.preValidation : [route.preValidation];
    route.preValidation = [...own, refuseNul];
  });
  // A compressed body (RFC 7694: the server names the codings it takes, here none) is 415, not
  // the "not valid JSON" its bytes would otherwise give.
  // A callback, not an async hook: it runs on every request, and most have no such header.
  app.addHook('preParsing', (request, _reply, payload, done) => {
    const coding = request.headers['content-encoding'];
    if (coding === undefined) return done(null, payload);
    const hasBody = request.headers['transfer-encoding'] !== undefined || Number(request.headers['content-length'] ?? 0) > 0;
    if (hasBody && String(coding).trim().toLowerCase() !== 'identity') {
      return done(new AppError(415, 'unsupported_media_type', `Content-Encoding ${String(coding).trim().slice(0, 40)} is not accepted: send the body uncompressed`));
    }
    done(null, payload);
  });
  app.setNotFoundHandler((request, reply) => {
    return reply.code(404).send(errorBody(404, 'not_found', `No route ${request.method} ${request.url.split('?')[0]}`));
  });
}

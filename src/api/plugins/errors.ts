import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { hasZodFastifySchemaValidationErrors, isResponseSerializationError } from 'fastify-type-provider-zod';
import { isDependencyDown } from '../../shared/dependency-errors.js';
import { AppError, type ErrorDetail } from '../../shared/errors.js';
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

// Fastify's own errors, by code, to the contract's names (contract section 4).
const FASTIFY_ERRORS: Record<string, { status: number; name: string; message: string }> = {
  FST_ERR_CTP_INVALID_JSON_BODY: { status: 400, name: 'invalid_json', message: 'The body is not valid JSON' },
  FST_ERR_CTP_EMPTY_JSON_BODY: { status: 400, name: 'invalid_json', message: 'The body is empty but declared as JSON' },
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

/** The one error handler of the service: every failure leaves as the spec's error body. */
export function toErrorBody(error: unknown, request: FastifyRequest): ErrorBody {
  if (error instanceof AppError) return errorBody(error.statusCode, error.errorName, error.message, error.details);
  if (hasZodFastifySchemaValidationErrors(error)) {
    const status = request.routeOptions.config?.validationStatus ?? 422;
    const context = (error as { validationContext?: string }).validationContext;
    const details = error.validation.map((v) => ({ path: detailPath(context, v.instancePath), message: v.message ?? 'invalid' }));
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

export function registerErrorHandling(app: App): void {
  app.setErrorHandler((error, request, reply: FastifyReply) => {
    const body = toErrorBody(error, request);
    if (body.statusCode >= 500) {
      request.log.error({ err: error }, body.statusCode === 503 ? 'dependency unavailable' : 'request failed');
    }
    if (body.statusCode === 503) void reply.header('Retry-After', '5');
    return reply.code(body.statusCode).send(body);
  });
  app.setNotFoundHandler((request, reply) => {
    return reply.code(404).send(errorBody(404, 'not_found', `No route ${request.method} ${request.url.split('?')[0]}`));
  });
}

import type { FastifyReply } from 'fastify';
import type { ErrorBody } from '../plugins/errors.js';
import type { EndpointResponse } from '../tools/dispatch.js';

/** v1 wraps every answer: `{ success: true, data }` or `{ success: false, error }`. */
export function v1Success(data: unknown, extra: Record<string, unknown> = {}) {
  return { success: true as const, data, ...extra };
}

export function v1Error(body: ErrorBody) {
  return { success: false as const, error: body };
}

function isErrorBody(body: unknown): body is ErrorBody {
  return typeof body === 'object' && body !== null && 'name' in body && 'message' in body && 'statusCode' in body;
}

/** Sends a v2 endpoint's answer as v1's: same status code, body wrapped. */
export function sendWrapped(reply: FastifyReply, response: EndpointResponse, extra: Record<string, unknown> = {}) {
  void reply.code(response.statusCode).headers(response.headers);
  if (response.statusCode < 400) return reply.send(v1Success(response.body, extra));
  const error = isErrorBody(response.body)
    ? response.body
    : { name: 'internal_error', message: 'Internal error', statusCode: response.statusCode };
  return reply.send(v1Error(error));
}

import type { FastifyRequest } from 'fastify';
import { errorBody } from '../plugins/errors.js';
import type { App } from '../types.js';
import { holds } from '../../shared/tokens/permissions.js';
import { findTool, type Tool } from './catalog.js';
import { dispatch, type EndpointRequest, type EndpointResponse } from './dispatch.js';

/** The endpoint request of arguments that failed the tool's schema, when one can be made of them. */
function requestFor(tool: Tool, args: unknown): EndpointRequest | undefined {
  try {
    return tool.toRequest(args !== null && typeof args === 'object' && !Array.isArray(args) ? args : {});
  } catch {
    return undefined;
  }
}

/**
 * Runs a tool for the caller of `from`: unknown tool 404, arguments failing the tool's
 * schema 422 naming them, otherwise whatever the endpoint answers.
 * Shared by `POST /api/v2/tools/{name}` and the MCP server.
 */
export async function runTool(app: App, from: FastifyRequest, name: string, args: unknown, options: { idempotencyKey?: string } = {}): Promise<EndpointResponse> {
  const tool = findTool(name);
  if (!tool) return { statusCode: 404, body: errorBody(404, 'not_found', `No tool named "${name}"`), headers: {} };
  const parsed = tool.inputSchema.safeParse(args ?? {});
  if (!parsed.success) {
    // A caller without the endpoint's permission gets the endpoint's 403 whatever the
    // arguments (docs/agents.md; permission comes before validation, as on v2): the endpoint says it.
    const refused = holds(from.caller.permissions, tool.permission) ? undefined : requestFor(tool, args);
    if (refused) return dispatch(app, from, refused);
    const details = parsed.error.issues.map((issue) => ({
      path: ['arguments', ...issue.path.map(String)].join('.'),
      message: issue.message,
    }));
    const first = details[0];
    return {
      statusCode: 422,
      body: errorBody(422, 'validation_error', first ? `${first.path}: ${first.message}` : 'Invalid arguments', details),
      headers: {},
    };
  }
  const request = tool.toRequest(args ?? {});
  // The call's own Idempotency-Key header, when its arguments give none (`idempotency_key`
  // wins): a retried HTTP call must not send twice because the key came the way REST sends it.
  if (options.idempotencyKey !== undefined && request.headers?.['idempotency-key'] === undefined) {
    request.headers = { ...request.headers, 'idempotency-key': options.idempotencyKey };
  }
  return dispatch(app, from, request);
}

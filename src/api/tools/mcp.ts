import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolRequestSchema, JSONRPCMessageSchema, ListToolsRequestSchema, type CallToolResult, type Tool as McpTool } from '@modelcontextprotocol/sdk/types.js';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { randomHex } from '../../shared/crypto.js';
import type { WindowRateLimiter } from '../../shared/rate-limits/window.js';
import { rateLimit } from '../plugins/auth.js';
import { errorBody, errorHandler } from '../plugins/errors.js';
import type { App } from '../types.js';
import { tools, type Tool } from './catalog.js';
import { runTool } from './run.js';

const SERVER_INFO = { name: 'mailroom', version: '2.0.0' };
// JSON-RPC 2.0 error codes (section 5.1).
const PARSE_ERROR = -32700;
const INVALID_REQUEST = -32600;
const INVALID_PARAMS = -32602;

// What a `tools/call` needs (MCP's CallToolRequest; `_meta` and the rest pass through).
const CallParams = z.looseObject({ name: z.string(), arguments: z.record(z.string(), z.unknown()).optional() });

function describe(tool: Tool): McpTool {
  return {
    name: tool.name,
    description: `${tool.description} (needs the "${tool.permission}" permission)`,
    inputSchema: tool.jsonSchema as McpTool['inputSchema'],
    annotations: {
      readOnlyHint: tool.readOnly,
      // MCP's default for a non-read tool is destructive: say false explicitly for the rest.
      destructiveHint: tool.destructive,
      openWorldHint: tool.destructive || tool.name === 'verify_email',
    },
  };
}

/**
 * One MCP server per HTTP request (stateless Streamable HTTP): its tools run as the caller
 * of that request, with the caller's own bearer token, through the same runner as
 * `POST /api/v2/tools/{name}`.
 */
function serverFor(app: App, request: FastifyRequest, reply: FastifyReply, body: CheckedBody): Server {
  const { invalid, order } = body;
  // The batch position of the call whose headers the answer carries so far.
  let shown = -1;
  const server = new Server(SERVER_INFO, {
    capabilities: { tools: {} },
    instructions: 'mailroom: transactional email, subscribers, campaigns, sending domains and address verification.',
  });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: tools.map(describe) }));
  server.setRequestHandler(CallToolRequestSchema, async (call, extra): Promise<CallToolResult> => {
    const reason = invalid.get(call.params.name);
    if (reason !== undefined) throw Object.assign(new Error(reason), { code: INVALID_PARAMS });
    const result = await runTool(app, request, call.params.name, call.params.arguments ?? {});
    // The endpoint's rate-limit headers (and a 429's Retry-After) on the HTTP answer: the
    // last call's in the batch's order, whichever finishes last (the calls of a batch run
    // together; the transport writes the headers once all have run).
    const position = order.get(extra.requestId) ?? 0;
    if (!reply.raw.headersSent && position >= shown) {
      shown = position;
      reply.raw.removeHeader('retry-after');
      for (const [name, value] of Object.entries(result.headers)) reply.raw.setHeader(name, value);
    }
    const body = result.body ?? errorBody(result.statusCode, 'internal_error', 'Empty response');
    return {
      content: [{ type: 'text', text: JSON.stringify(body) }],
      ...(result.statusCode >= 400 ? { isError: true } : isObject(body) ? { structuredContent: body } : {}),
    };
  });
  return server;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

interface CheckedBody {
  /** The body for the MCP server: each invalid `tools/call` replaced by a placeholder. */
  messages: unknown;
  /** The placeholders' reasons, by their tool name. */
  invalid: Map<string, string>;
  /** Each request's position in the batch, by its JSON-RPC id. */
  order: Map<string | number, number>;
}

/**
 * The body with each `tools/call` whose params are not a call (no tool name, arguments that are
 * not an object) replaced by a placeholder call, its reason kept in `invalid` under the
 * placeholder's name: the SDK would answer such a call with an internal error (-32603) and its
 * schema's dump; the handler answers the placeholder -32602 with the reason instead. The names
 * carry a random part: no tool's name, and no caller can guess one.
 */
function setAsideInvalidCalls(body: unknown): CheckedBody {
  const invalid = new Map<string, string>();
  const order = new Map<string | number, number>();
  const marker = `\u0000${randomHex(8)}:`;
  const check = (message: unknown, index: number): unknown => {
    if (isObject(message) && (typeof message.id === 'string' || typeof message.id === 'number')) order.set(message.id, index);
    if (!isObject(message) || message.method !== 'tools/call' || message.id === undefined) return message;
    const parsed = CallParams.safeParse(message.params);
    if (parsed.success) return message;
    const name = marker + index;
    invalid.set(name, parsed.error.issues.map((issue) => `${['params', ...issue.path.map(String)].join('.')}: ${issue.message}`).join('; '));
    return { ...message, params: { name } };
  };
  return { messages: Array.isArray(body) ? body.map(check) : check(body, 0), invalid, order };
}

/**
 * Why a body is no JSON-RPC message (nor batch of them) the MCP server takes, or undefined: the
 * SDK answers such JSON with -32700 (a parse error), JSON-RPC 2.0 (section 5.1) with -32600.
 */
function invalidRequest(body: unknown): string | undefined {
  if (!Array.isArray(body)) return JSONRPCMessageSchema.safeParse(body).success ? undefined : 'not a JSON-RPC 2.0 message';
  if (body.length === 0) return 'an empty batch';
  // The SDK refuses a whole batch for one message it cannot read; it would also answer one
  // request of two with the same id and lose the other's answer (its answers are keyed by id).
  if (body.some((message) => !JSONRPCMessageSchema.safeParse(message).success)) return 'a message of the batch is not a JSON-RPC 2.0 message';
  const ids = body.filter((message) => isObject(message) && 'method' in message && message.id !== undefined).map((message) => JSON.stringify((message as { id: unknown }).id));
  return new Set(ids).size === ids.length ? undefined : 'two requests of the batch have the same id';
}

/** A JSON-RPC message (or batch) that only runs tools: those are counted by their endpoint. */
function onlyToolCalls(body: unknown): boolean {
  const messages = Array.isArray(body) ? body : [body];
  return messages.length > 0 && messages.every((m) => isObject(m) && m.method === 'tools/call');
}

/**
 * `/mcp`: the tool catalog over MCP Streamable HTTP, stateless (no session id).
 * A `tools/call` is counted against the rate limit by the endpoint it dispatches to; any
 * other message (initialize, tools/list, ...) is counted here, once.
 */
export function mcpRoutes(limiter: WindowRateLimiter) {
  return async (app: App): Promise<void> => {
    // A body the HTTP layer refuses before the MCP server reads it (not JSON, not JSON's
    // content type, too large, JSON it does not take: prototype poisoning, nested too deep;
    // /mcp has no body schema of its own) is answered as JSON-RPC 2.0 answers it (section 5.1),
    // with the HTTP status of the REST API: an MCP client parses the error either way.
    app.setErrorHandler(
      errorHandler((body) => {
        const refusedBody = body.statusCode === 413 || body.statusCode === 415 || body.name === 'validation_error';
        const code = body.name === 'invalid_json' ? PARSE_ERROR : refusedBody ? INVALID_REQUEST : undefined;
        return code === undefined ? body : { jsonrpc: '2.0', error: { code, message: body.message }, id: null };
      }),
    );
    // Its JSON-RPC body is read by the MCP server; tool arguments reach an endpoint, which
    // refuses U+0000 itself (as a tool error the client can read).
    app.post('/mcp', { schema: { hide: true }, config: { acceptsNul: true } }, async (request, reply) => {
      // A `tools/call` whose params are not a call is answered on its own (-32602), before the
      // body is read as JSON-RPC: the rest of its batch still runs.
      const body = setAsideInvalidCalls(request.body);
      const problem = invalidRequest(body.messages);
      if (problem) {
        await rateLimit(limiter, request.caller, reply);
        return reply.code(400).send({ jsonrpc: '2.0', error: { code: INVALID_REQUEST, message: `Invalid Request: ${problem}` }, id: null });
      }
      // A call refused here reaches no endpoint: the message is counted here, like initialize.
      if (!onlyToolCalls(body.messages) || body.invalid.size > 0) await rateLimit(limiter, request.caller, reply);
      const server = serverFor(app, request, reply, body);
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
      // The transport writes the answer itself: the headers set so far (X-Request-Id, the
      // rate limit's) go on the raw response first, or they would be lost with the hijack.
      for (const [name, value] of Object.entries(reply.getHeaders())) if (value !== undefined) reply.raw.setHeader(name, value);
      reply.hijack();
      reply.raw.on('close', () => {
        void transport.close();
        void server.close();
      });
      await server.connect(transport);
      await transport.handleRequest(request.raw, reply.raw, body.messages);
    });

    // Stateless: no server-initiated stream to GET, no session to DELETE.
    const notAllowed = async (_request: FastifyRequest, reply: FastifyReply) =>
      reply.code(405).header('allow', 'POST').send(errorBody(405, 'method_not_allowed', 'This MCP endpoint is stateless: use POST'));
    app.get('/mcp', { schema: { hide: true } }, notAllowed);
    app.delete('/mcp', { schema: { hide: true } }, notAllowed);
  };
}

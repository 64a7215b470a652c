import { z } from 'zod';
import { list, listEnvelope } from '../schemas.js';
import type { App } from '../types.js';
import { holds } from '../../shared/tokens/permissions.js';
import { findTool, tools } from './catalog.js';
import { runTool } from './run.js';

const ToolShape = z.object({
  name: z.string(),
  description: z.string(),
  inputSchema: z.record(z.string(), z.unknown()).describe('JSON Schema of `arguments`'),
  permission: z.string().describe('Permission the underlying endpoint asks'),
});

const RunBody = z.object({
  arguments: z.record(z.string(), z.unknown()).optional().describe("The tool's arguments (its inputSchema)"),
});

/** `GET /api/v2/tools`: any valid token; counted against the rate limit like any request. */
export async function toolCatalogRoutes(app: App): Promise<void> {
  app.get(
    '/tools',
    {
      schema: {
        tags: ['tools'],
        summary: 'List the tools agents can run (any valid token)',
        response: { 200: listEnvelope(ToolShape) },
      },
    },
    async () =>
      list(
        tools.map((tool) => ({ name: tool.name, description: tool.description, inputSchema: tool.jsonSchema, permission: tool.permission })),
        false,
      ),
  );
}

/**
 * `POST /api/v2/tools/{name}`: runs the tool as its endpoint, which checks the permission,
 * counts the rate limit and quotas, and answers (status and body passed through).
 */
export async function toolRunRoutes(app: App): Promise<void> {
  app.post(
    '/tools/:name',
    {
      schema: {
        tags: ['tools'],
        summary: "Run a tool with the caller's token: answers what its endpoint answers",
        params: z.object({ name: z.string() }),
        body: RunBody,
        // Any status and body: the endpoint's, passed through unchanged.
        response: { 200: z.unknown(), '4xx': z.unknown(), '5xx': z.unknown() },
      },
      // A caller without the tool's permission gets its endpoint's 403 whatever the body (docs/agents.md:
      // permission before validation, as on v2), before this route's own body schema is checked.
      preValidation: async (request, reply) => {
        const tool = findTool(request.params.name);
        if (!tool || holds(request.caller.permissions, tool.permission)) return;
        const result = await runTool(app, request, tool.name, undefined);
        return reply.code(result.statusCode).headers(result.headers).send(result.body);
      },
    },
    async (request, reply) => {
      const key = request.headers['idempotency-key'];
      const result = await runTool(app, request, request.params.name, request.body.arguments, typeof key === 'string' ? { idempotencyKey: key } : {});
      return reply.code(result.statusCode).headers(result.headers).send(result.body);
    },
  );
}

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { expect } from 'vitest';
import { bearer, type TestContext } from './context.js';

export interface ToolAnswer {
  statusCode: number;
  body: unknown;
}

/** MCP clients (the SDK's own) connected to the app listening on loopback, one per token. */
export class McpClients {
  private readonly clients = new Map<string, Client>();

  constructor(private readonly baseUrl: string) {}

  async for(token: string): Promise<Client> {
    let client = this.clients.get(token);
    if (!client) {
      client = new Client({ name: 'mailroom-test', version: '1.0.0' });
      const transport = new StreamableHTTPClientTransport(new URL(`${this.baseUrl}/mcp`), { requestInit: { headers: bearer(token) } });
      await client.connect(transport);
      this.clients.set(token, client);
    }
    return client;
  }

  async close(): Promise<void> {
    for (const client of this.clients.values()) await client.close();
    this.clients.clear();
  }
}

/** Runs a tool through `POST /api/v2/tools/{name}`. */
export async function runOverHttp(ctx: TestContext, token: string, name: string, args: unknown): Promise<ToolAnswer> {
  const res = await ctx.app.inject({ method: 'POST', url: `/api/v2/tools/${name}`, headers: bearer(token), payload: { arguments: args } });
  return { statusCode: res.statusCode, body: res.body ? res.json() : null };
}

/** Runs a tool over MCP; the status is only known as error or not. */
export async function runOverMcp(clients: McpClients, token: string, name: string, args: Record<string, unknown>) {
  const client = await clients.for(token);
  const result = await client.callTool({ name, arguments: args });
  const content = result.content as Array<{ type: string; text: string }>;
  expect(content[0]?.type).toBe('text');
  return { isError: result.isError === true, body: JSON.parse(content[0]!.text) as unknown };
}

/**
 * Runs a tool both ways and checks they agree (the same body, an MCP error exactly when the
 * HTTP status is 4xx/5xx). Fields that differ per call (`ignore`, e.g. a fresh id) are
 * compared by presence only. Returns the HTTP answer.
 */
export async function runBoth(
  ctx: TestContext,
  clients: McpClients,
  token: string,
  name: string,
  args: Record<string, unknown>,
  options: { ignore?: string[]; once?: boolean } = {},
): Promise<ToolAnswer> {
  const http = await runOverHttp(ctx, token, name, args);
  if (options.once) return http;
  const mcp = await runOverMcp(clients, token, name, args);
  expect(mcp.isError).toBe(http.statusCode >= 400);
  expect(strip(mcp.body, options.ignore)).toEqual(strip(http.body, options.ignore));
  return http;
}

function strip(body: unknown, ignore: string[] = []): unknown {
  if (!ignore.length || typeof body !== 'object' || body === null) return body;
  const copy: Record<string, unknown> = { ...(body as Record<string, unknown>) };
  for (const key of ignore) if (key in copy) copy[key] = '<ignored>';
  return copy;
}

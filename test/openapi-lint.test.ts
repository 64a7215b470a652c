import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestContext, type TestContext } from './helpers/context.js';
import { ROOT } from './helpers/process.js';

let ctx: TestContext;
let doc: {
  paths: Record<string, Record<string, { operationId?: string; responses: Record<string, { content?: Record<string, { schema?: { $ref?: string } }> }> }>>;
  components: { schemas: Record<string, unknown> };
};

beforeAll(async () => {
  ctx = await createTestContext();
  doc = (await ctx.app.inject({ url: '/api/v2/openapi.json' })).json();
});
afterAll(async () => ctx?.close());

const operations = () =>
  Object.entries(doc.paths).flatMap(([path, ops]) => Object.entries(ops).map(([method, op]) => ({ key: `${method.toUpperCase()} ${path}`, path, op })));

describe('the OpenAPI document (README.md "API overview")', () => {
  it('passes `redocly lint` (recommended rules) with no error and no warning', { timeout: 60_000 }, async () => {
    const dir = await mkdtemp(join(tmpdir(), 'mailroom-openapi-'));
    try {
      const file = join(dir, 'openapi.json');
      await writeFile(file, JSON.stringify(doc));
      const { stdout } = await promisify(execFile)(join(ROOT, 'node_modules/.bin/redocly'), ['lint', file, '--format=json'], {
        cwd: dir,
        env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
      }).catch((error: { stdout?: string }) => ({ stdout: error.stdout ?? '' }));
      const report = JSON.parse(stdout.slice(stdout.indexOf('{')));
      const problems = report.problems.map((p: { ruleId: string; message: string; location: Array<{ pointer: string }> }) => `${p.ruleId}: ${p.message} at ${p.location[0]?.pointer}`);
      expect(problems).toEqual([]);
      expect(report.totals).toMatchObject({ errors: 0, warnings: 0 });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('names every operation, uniquely', () => {
    const ids = operations().map(({ op }) => op.operationId);
    expect(ids.every((id) => typeof id === 'string' && /^[a-z][A-Za-z0-9]+$/.test(id))).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
    expect(doc.paths['/api/v2/tokens/{id}']!.delete!.operationId).toBe('deleteTokensById');
  });

  it('shares the error body and the resources as components, and lists the 4xx answers of each route', () => {
    expect(doc.components.schemas.Error).toMatchObject({ required: ['name', 'message', 'statusCode'] });
    for (const name of ['Campaign', 'Subscriber', 'Tag', 'Email', 'Domain', 'Sender', 'Token', 'Verification']) {
      expect(doc.components.schemas[name], name).toBeDefined();
    }
    for (const { key, path, op } of operations()) {
      if (!path.startsWith('/api/v2/') || path === '/api/v2/tools/{name}') continue;
      for (const status of ['401', '403', '429']) {
        expect(op.responses[status]?.content?.['application/json']?.schema?.$ref, `${key} ${status}`).toBe('#/components/schemas/Error');
      }
      if (path.includes('{')) expect(op.responses['404'], `${key} 404`).toBeDefined();
    }
    expect(doc.paths['/api/v2/campaigns/{campaignId}']!.get!.responses['200']!.content!['application/json']!.schema!.$ref).toBe('#/components/schemas/Campaign');
    expect(doc.paths['/api/v2/emails']!.post!.responses['422']).toBeDefined();
  });

  it("says each route's permission, the name of its 403, and its 400s as the spec names them", () => {
    type Op = { description?: string; responses: Record<string, { description?: string }> };
    const op = (path: string, method: string) => (doc.paths[path] as unknown as Record<string, Op>)[method]!;
    const send = op('/api/v2/campaigns/{campaignId}/send', 'post');
    expect(send.description).toContain('Permission: `send`.');
    expect(send.responses['400']!.description).toMatch(/^validation_error/);
    expect(send.responses['403']!.description).toMatch(/^missing_permission/);
    // docs/agents.md: the two email reads answer 403 validation_error.
    expect(op('/api/v2/emails', 'get').responses['403']!.description).toMatch(/^validation_error/);
    expect(op('/api/v2/emails/{id}', 'get').responses['403']!.description).toMatch(/^validation_error/);
    const events = op('/api/v2/events', 'post');
    expect(events.responses['404']).toBeDefined();
    expect(events.responses['400']!.description).toMatch(/^validation_error/);
    // Validation errors are 400 there: no 422 but the one the route names (the sending policy).
    expect(events.responses['422']).toBeUndefined();
    expect(send.responses['422']).toBeDefined();
    // Campaign send takes no body at all (docs/campaigns.md "API decisions").
    expect((send as unknown as { requestBody: { required?: boolean } }).requestBody.required).toBe(false);
    // A route with no permission of its own names none.
    expect(op('/api/v2/tools', 'get').responses['403']!.description).not.toMatch(/needed/);
  });

  it('says every request body refuses unknown fields, as the API does, but the campaign PATCH that ignores them', () => {
    type Body = { requestBody?: { content: Record<string, { schema: { additionalProperties?: unknown; $ref?: string; anyOf?: unknown[] } }> } };
    const schemaOf = (path: string, method: string) => (doc.paths[path] as unknown as Record<string, Body>)[method]!.requestBody!.content['application/json']!.schema;
    for (const [path, method] of [
      ['/api/v2/tokens', 'post'],
      ['/api/v2/domains', 'post'],
      ['/api/v2/subscribers', 'post'],
      ['/api/v2/subscribers/{subscriber}', 'patch'],
      ['/api/v2/tags/{tag}', 'patch'],
      ['/api/v2/events', 'post'],
      ['/api/v2/verify', 'post'],
      ['/api/v2/emails', 'post'],
    ] as const) {
      expect(schemaOf(path, method).additionalProperties, `${method} ${path}`).toBe(false);
    }
    expect(schemaOf('/api/v2/campaigns/{campaignId}', 'patch').additionalProperties).not.toBe(false);
  });

  it('takes a recipient as a string or a list, as the API does', () => {
    const body = (doc.paths['/api/v2/emails'] as unknown as Record<string, { requestBody: { content: Record<string, { schema: { properties: Record<string, { anyOf?: Array<{ type?: string }> }> } }> } }>).post!
      .requestBody.content['application/json']!.schema;
    for (const field of ['to', 'cc', 'bcc', 'reply_to']) {
      expect(body.properties[field]!.anyOf?.map((s) => s.type), field).toEqual(['string', 'array']);
    }
  });
});

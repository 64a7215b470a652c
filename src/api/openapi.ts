/**
 * The last step of the OpenAPI document (`/api/v2/openapi.json`): what every operation has in
 * common is added here, once, rather than repeated in every route's schema.
 *
 * - `operationId` (when a route gives none): the method and the path, e.g.
 *   `DELETE /api/v2/tokens/{id}` → `deleteTokensById`.
 * - The error answers an operation can give, each the shared `Error` body
 *   (`components.schemas.Error`): 401/403/429 behind a token, 404 with a path parameter,
 *   400/413/415/422 with a body, 422 with a query, and the answers a route documents itself.
 * - `anyOf` with a single member (zod's optional-of-union output) is inlined.
 *
 * `npx @redocly/cli lint` of the result has no error and no warning (test/openapi.test.ts).
 */
type Json = Record<string, unknown>;

const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];

const ERROR_SCHEMA: Json = {
  type: 'object',
  description: 'Every error answer has this body, whatever its status.',
  required: ['name', 'message', 'statusCode'],
  properties: {
    name: { type: 'string', description: 'Machine-readable code, e.g. validation_error, not_found', examples: ['validation_error'] },
    message: { type: 'string', description: 'What went wrong, for a person', examples: ['to: must be an email address'] },
    statusCode: { type: 'integer', examples: [422] },
    details: {
      type: 'array',
      description: 'For validation errors: one item per problem',
      items: {
        type: 'object',
        required: ['path', 'message'],
        properties: { path: { type: 'string', examples: ['to'] }, message: { type: 'string', examples: ['must be an email address'] } },
      },
    },
  },
};

const ERROR_TEXT: Record<string, string> = {
  '400': 'invalid_json: the body is not valid JSON',
  '401': 'missing_api_key: no token, or an unknown or revoked one',
  '403': 'missing_permission: the token lacks the permission of the route',
  '404': 'not_found: no such resource in the organization',
  '405': 'method_not_allowed',
  '409': 'idempotency_conflict',
  '413': 'payload_too_large',
  '415': 'unsupported_media_type: the body is not JSON',
  '422': 'validation_error: the request is not valid; details name each problem',
  '429': 'rate_limit_exceeded: too many requests with this token; see Retry-After',
};

/** Error answers a route gives beyond what its shape implies, by "METHOD path". */
const EXTRA_ERRORS: Record<string, string[]> = {
  'DELETE /api/v2/subscribers/{subscriber}': ['405'],
  // An unknown subscriber, named in the body (docs/audience.md "Events").
  'POST /api/v2/events': ['404'],
  // A sender on a domain the sending policy refuses (docs/security.md "The sending policy"); its other errors are 400.
  'POST /api/v2/campaigns/{campaignId}/send': ['422'],
  'POST /api/v2/emails': ['409'],
  'POST /api/v2/emails/batch': ['409'],
};

function operationIdOf(method: string, path: string): string {
  const words = path
    .replace(/^\/api\/v2\//, '')
    .split('/')
    .filter(Boolean)
    .map((segment) => {
      const param = /^\{(.+)\}$/.exec(segment);
      return param ? `By-${param[1]}` : segment;
    })
    .join('-')
    .split(/[^A-Za-z0-9]+/)
    .filter(Boolean);
  return [method, ...words].map((w, i) => (i === 0 ? w.toLowerCase() : w[0]!.toUpperCase() + w.slice(1))).join('');
}

function errorResponse(status: string, description = ERROR_TEXT[status]): Json {
  return {
    description: description ?? 'Error',
    content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } },
  };
}

/** Inlines `anyOf: [one]`, everywhere in a schema tree. */
function inlineSingleAnyOf(node: unknown): void {
  if (Array.isArray(node)) {
    node.forEach(inlineSingleAnyOf);
    return;
  }
  if (!node || typeof node !== 'object') return;
  const object = node as Json;
  for (const value of Object.values(object)) inlineSingleAnyOf(value);
  for (const key of ['anyOf', 'oneOf']) {
    const members = object[key];
    if (Array.isArray(members) && members.length === 1 && members[0] && typeof members[0] === 'object') {
      delete object[key];
      for (const [k, v] of Object.entries(members[0] as Json)) if (!(k in object)) object[k] = v;
    }
  }
}

export function finishOpenApi<T extends object>(document: T): T {
  const doc = document as unknown as Json;
  const components = ((doc.components ??= {}) as Json);
  const schemas = ((components.schemas ??= {}) as Json);
  schemas.Error ??= ERROR_SCHEMA;
  const paths = (doc.paths ?? {}) as Record<string, Json>;
  const ids = new Set<string>();
  for (const [path, operations] of Object.entries(paths)) {
    for (const method of METHODS) {
      const operation = operations[method] as Json | undefined;
      if (!operation) continue;
      let id = (operation.operationId as string | undefined) ?? operationIdOf(method, path);
      while (ids.has(id)) id = `${id}Again`;
      ids.add(id);
      operation.operationId = id;

      const responses = ((operation.responses ??= {}) as Json);
      // A catch-all the route declared (the tools endpoint relays any answer) keeps its place.
      const relays = '4XX' in responses;
      const statuses = new Set<string>(EXTRA_ERRORS[`${method.toUpperCase()} ${path}`] ?? []);
      const authenticated = path.startsWith('/api/v2/') && operation.security === undefined;
      if (authenticated) ['401', '403', '429'].forEach((s) => statuses.add(s));
      const parameters = (operation.parameters ?? []) as Array<{ in?: string }>;
      if (parameters.some((p) => p.in === 'path')) statuses.add('404');
      if (parameters.some((p) => p.in === 'query')) statuses.add('422');
      if (operation.requestBody) ['400', '413', '415', '422'].forEach((s) => statuses.add(s));
      if (statuses.size === 0 && !relays) statuses.add('404');
      // The route's own config (app.ts transform): its permission, the name of its 403, and
      // the status of its validation errors (400 on the routes the spec says so).
      const permission = operation['x-permission'] as string | undefined;
      const forbidden = (operation['x-permission-error'] as string | undefined) ?? 'missing_permission';
      const invalid = operation['x-validation-status'] === 400 ? '400' : '422';
      delete operation['x-permission-error'];
      delete operation['x-validation-status'];
      if (permission) {
        const needs = `Permission: \`${permission}\`.`;
        operation.description = operation.description ? `${operation.description as string}\n\n${needs}` : needs;
      }
      const described: Record<string, string> = {
        ...(permission ? { '403': `${forbidden}: the token lacks the \`${permission}\` permission` } : {}),
        ...(invalid === '400'
          ? { '400': 'validation_error: the request is not valid (details name each problem); invalid_json: the body is not valid JSON' }
          : {}),
      };
      // A route whose validation errors are 400 answers 422 only where it says so (EXTRA_ERRORS).
      if (invalid === '400' && !EXTRA_ERRORS[`${method.toUpperCase()} ${path}`]?.includes('422')) statuses.delete('422');
      // A body the route takes as optional (no body, or null) is not required.
      const body = (operation.requestBody as { required?: boolean; content?: Record<string, { schema?: { anyOf?: Array<{ type?: string }> } }> } | undefined);
      if (body?.content?.['application/json']?.schema?.anyOf?.some((member) => member.type === 'null')) body.required = false;
      for (const status of [...statuses].sort()) {
        if (!relays && !(status in responses)) responses[status] = errorResponse(status, described[status]);
      }
      if (relays) responses['4XX'] = { ...errorResponse('422'), description: 'The error answer of the called endpoint' };
    }
  }
  inlineSingleAnyOf(paths);
  inlineSingleAnyOf(schemas);
  dropUnusedSchemas(doc, schemas);
  return document;
}

/**
 * The schema generator emits an input and an output variant of every shared schema; the
 * variants no operation refers to (most `…Input`) are left out.
 */
function dropUnusedSchemas(doc: Json, schemas: Json): void {
  const used = new Set<string>();
  const visit = (node: unknown): void => {
    if (Array.isArray(node)) return node.forEach(visit);
    if (!node || typeof node !== 'object') return;
    for (const [key, value] of Object.entries(node as Json)) {
      if (key === '$ref' && typeof value === 'string' && value.startsWith('#/components/schemas/')) {
        const name = value.slice('#/components/schemas/'.length);
        if (!used.has(name)) {
          used.add(name);
          visit(schemas[name]);
        }
      } else {
        visit(value);
      }
    }
  };
  visit(doc.paths);
  for (const name of Object.keys(schemas)) if (!used.has(name)) delete schemas[name];
}

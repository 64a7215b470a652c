import { isUtf8 } from 'node:buffer';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import type { EntityManager } from '@mikro-orm/postgresql';
import type { z } from 'zod';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyRequest } from 'fastify';
import { jsonSchemaTransform, jsonSchemaTransformObject, serializerCompiler, validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import type { Services } from '../shared/container.js';
import { ValidationError } from '../shared/errors.js';
import { JSON_TOO_DEEP, jsonNestedDeeperThan } from '../shared/json-depth.js';
import { registerAgentInterfaces } from './agents.js';
import { dashboard } from './dashboard/index.js';
import { finishOpenApi } from './openapi.js';
import { installValidationMessages, singleValuedQuery, strictBody } from './validation.js';
import { adminDashboard } from './plugins/admin.js';
import { authHook } from './plugins/auth.js';
import { BODY_NOT_UTF8, clientErrorHandler, frameworkError, registerErrorHandling, validationStatusOf } from './plugins/errors.js';
import { countAnswer, registerMetrics } from './plugins/metrics.js';
import { confirmRoutes } from './routes/confirm.js';
import { unsubscribeRoutes } from './routes/unsubscribe.js';
import { healthRoutes } from './routes/health.js';
import { v2Routes } from './routes/index.js';
import { providerWebhooksRoutes } from './routes/provider-webhooks.js';
import { providerWebhookRoutes, trackingRoutes } from './routes/tracking.js';
import type { App } from './types.js';
import { v1Error } from './v1/envelope.js';

export interface BuildAppOptions {
  /** Log every request (off in tests and benchmarks). */
  logRequests?: boolean;
}

// docs/foundation.md "Errors": 1 MiB per request; routes that take many items (batch) raise it to 10 MiB.
export const BODY_LIMIT = 1024 * 1024;

export async function buildApp(services: Services, options: BuildAppOptions = {}): Promise<App> {
  const app = Fastify({
    loggerInstance: services.logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: !options.logRequests }),
    bodyLimit: BODY_LIMIT,
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && /^[\w.-]{1,64}$/.test(given) ? given : crypto.randomUUID();
    },
    requestIdHeader: false,
    return503OnClosing: true,
    clientErrorHandler,
    // A path parameter may be an email address (up to 254 characters, more once
    // percent-encoded) or a signed token (schemas allow 2,000): Fastify's default of 100
    // refused real addresses.
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 2048 },
    frameworkErrors: (error, request, reply) => {
      frameworkError(error, request, reply, request.url.startsWith('/api/v1/') ? v1Error : undefined);
      // Answered before routing, so without the hook that counts every other answer.
      countAnswer(services.metrics, request, reply, 'unmatched');
    },
  }).withTypeProvider<ZodTypeProvider>();

  // Unknown body fields are refused, and zod's messages are written for a person (validation.ts).
  installValidationMessages();
  // Only the API's own bodies: the provider webhooks and the dashboard's forms take what others send.
  app.setValidatorCompiler<z.ZodType>((route) => {
    if (!route.url.startsWith('/api/v2/')) return validatorCompiler(route);
    if (route.httpPart === 'body') return validatorCompiler({ ...route, schema: strictBody(route.schema) as z.ZodType });
    if (route.httpPart === 'querystring') return validatorCompiler({ ...route, schema: singleValuedQuery(route.schema) as z.ZodType });
    return validatorCompiler(route);
  });
  app.setSerializerCompiler(serializerCompiler);
  // Only JSON bodies are accepted anywhere: anything else is 415 (docs/foundation.md "Errors").
  app.removeContentTypeParser(['text/plain']);
  // An empty body declared as JSON is no body (what many clients send with a POST that has
  // nothing to say): a route whose body is optional takes it, one that needs a body answers
  // its validation error. Anything else goes to Fastify's own parser (prototype poisoning
  // refused).
  const parseJson = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body, done) => {
    // JSON between systems is UTF-8 (RFC 8259 8.1), whatever charset a client declares: other
    // bytes are refused, not decoded into U+FFFD and stored so.
    if (!isUtf8(body as Buffer)) return done(Object.assign(new Error('The body is not valid JSON: it is not UTF-8'), { code: BODY_NOT_UTF8 }), undefined);
    const text = body.toString();
    if (text === '') return done(null, undefined);
    // Valid JSON the service will not take is a validation error of the body, in the route's
    // status (400 on the routes the spec gives it), not `invalid_json`.
    const refuse = (message: string) => done(new ValidationError(`body: ${message}`, [{ path: 'body', message }], validationStatusOf(request)), undefined);
    if (jsonNestedDeeperThan(text)) return refuse(JSON_TOO_DEEP);
    return parseJson(request, text, (error, value) => {
      // Refused by the safe parser, yet JSON: prototype poisoning (a `__proto__` key, or
      // `constructor` holding `prototype`). The plain parser makes such keys own properties.
      if (error && isJson(text)) return refuse('a key "__proto__", or "constructor" holding "prototype", is not accepted');
      done(error, value);
    });
  });
  app.decorate('services', services);
  app.decorateRequest('caller', null as never);
  // A fork per request, made on first use: /healthz, the public pixels and the requests
  // refused before their handler never pay for one.
  const forks = new WeakMap<object, EntityManager>();
  app.decorateRequest('em', {
    getter(this: FastifyRequest) {
      let em = forks.get(this);
      if (!em) {
        em = services.orm.em.fork();
        forks.set(this, em);
      }
      return em;
    },
  });
  app.addHook('onRequest', async (request, reply) => {
    void reply.header('x-request-id', request.id);
  });
  registerErrorHandling(app);
  registerMetrics(app);

  // Graceful shutdown: a request accepted before close() is still answered, but its
  // keep-alive connection must then close, or server.close() waits for that idle socket
  // until keepAliveTimeout (72 s). Fastify only does this for requests routed after close().
  let closing = false;
  app.addHook('preClose', (done) => {
    closing = true;
    done();
  });
  app.addHook('onSend', (_request, reply, payload, done) => {
    if (closing) void reply.header('connection', 'close');
    done(null, payload);
  });

  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'mailroom API',
        version: '2.0.0',
        description: 'Transactional email, campaigns, audience, sending domains and address verification.',
        license: { name: 'MIT', identifier: 'MIT' },
      },
      // The document is served by the API it describes: a relative server is always right
      // (and PUBLIC_URL may name another host, e.g. a tracking domain).
      servers: [{ url: '/', description: 'this server' }],
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'An API token: svc_ + 64 hex' } } },
      security: [{ bearer: [] }],
    },
    // What a route's config says that its schema cannot: its permission, the name of its 403
    // and the status of its validation errors (read by finishOpenApi).
    transform: (input) => {
      // The body as validated (unknown fields refused: strictBody, as the validator compiler above).
      const body = input.url.startsWith('/api/v2/') ? input.schema?.body : undefined;
      const out = jsonSchemaTransform(body ? { ...input, schema: { ...input.schema, body: strictBody(body) } } : input);
      const config = (input.route.config ?? {}) as { permission?: string; permissionErrorName?: string; validationStatus?: number };
      const marks = {
        ...(config.permission ? { 'x-permission': config.permission } : {}),
        ...(config.permissionErrorName ? { 'x-permission-error': config.permissionErrorName } : {}),
        ...(config.validationStatus ? { 'x-validation-status': config.validationStatus } : {}),
      };
      return { ...out, schema: { ...out.schema, ...marks } };
    },
    // Shared schemas (zod `.meta({ id })`) into components, then what every operation shares.
    transformObject: (input) => finishOpenApi(jsonSchemaTransformObject(input)),
  });
  await app.register(swaggerUi, { routePrefix: '/docs' });

  await app.register(healthRoutes);
  await app.register(adminDashboard);
  await app.register(confirmRoutes);
  await app.register(unsubscribeRoutes);
  await app.register(trackingRoutes);
  await app.register(providerWebhookRoutes);
  await app.register(providerWebhooksRoutes);
  app.get('/api/v2/openapi.json', { schema: { hide: true } }, async () => app.swagger());

  // Learns of revoked tokens from every process
  // (docs/foundation.md "Authentication and rate limiting"); stopped by closeServices.
  const tokenCache = services.tokenCache;
  const rateLimiter = services.tokenLimiter;
  await app.register(
    async (v2) => {
      v2.addHook('onRequest', authHook(services, tokenCache, rateLimiter));
      for (const routes of v2Routes) await v2.register(routes);
    },
    { prefix: '/api/v2' },
  );
  await registerAgentInterfaces(app, services, tokenCache, rateLimiter);
  // The dashboard (docs/dashboard.md) in its own scope: form bodies, sessions, HTML errors.
  await app.register(dashboard, { tokenCache });

  return app as unknown as App;
}

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

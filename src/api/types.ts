import type { EntityManager } from '@mikro-orm/postgresql';
import type { FastifyBaseLogger, FastifyInstance, RawReplyDefaultExpression, RawRequestDefaultExpression, RawServerDefault } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import type { Services } from '../shared/container.js';
import type { Permission } from '../shared/tokens/permissions.js';
import type { Caller } from '../shared/tokens/service.js';

declare module 'fastify' {
  interface FastifyInstance {
    services: Services;
  }
  interface FastifyRequest {
    /** Set by the auth hook on every authenticated route. */
    caller: Caller;
    /** A fresh EntityManager fork for this request (never the global one). */
    em: EntityManager;
  }
  interface FastifyContextConfig {
    /** The scope the route needs (docs/foundation.md "Tokens and permissions"). */
    permission?: Permission;
    /** Error name when the scope is missing; the spec asks `validation_error` on email reads. */
    permissionErrorName?: string;
    /** Status of a request validation failure: 422 unless the spec says 400. */
    validationStatus?: number;
    /** The route passes its input on unread (MCP): U+0000 is refused by what it dispatches to. */
    acceptsNul?: boolean;
  }
}

export type App = FastifyInstance<
  RawServerDefault,
  RawRequestDefaultExpression,
  RawReplyDefaultExpression,
  FastifyBaseLogger,
  ZodTypeProvider
>;

import { z } from 'zod';
import { PermissionSchema, PresetSchema } from '../../shared/tokens/permissions.js';
import { revokeToken } from '../../shared/tokens/revoke.js';
import { createToken } from '../../shared/tokens/service.js';
import { iso, limitQuery, list, listEnvelope, Timestamp } from '../schemas.js';
import type { App } from '../types.js';

const CreateTokenBody = z
  .object({
    name: z.string().trim().min(1, 'must be 1 to 100 characters').max(100, 'must be 1 to 100 characters'),
    reuseIfExists: z.boolean().optional(),
    permissions: z.array(PermissionSchema).min(1).optional(),
    preset: PresetSchema.optional(),
  })
  .refine((body) => !(body.preset && body.permissions), {
    message: 'give either preset or permissions, not both',
    path: ['preset'],
  });

const CreatedToken = z.object({
  id: z.string(),
  name: z.string(),
  token: z.string(),
  permissions: z.array(z.string()),
  createdAt: Timestamp,
  reused: z.boolean(),
}).meta({ id: 'CreatedToken' });

const TokenSummary = z.object({
  id: z.string(),
  name: z.string(),
  last4: z.string(),
  permissions: z.array(z.string()),
  createdAt: Timestamp,
}).meta({ id: 'Token' });

export async function tokensRoutes(app: App): Promise<void> {
  // Listing is the hot path of token reads (bench:auth); creating is rare.
  const listCache = app.services.tokenListCache;

  app.post(
    '/tokens',
    {
      config: { permission: 'tokens' },
      schema: { tags: ['tokens'], summary: 'Create an API token', body: CreateTokenBody, response: { 200: CreatedToken } },
    },
    async (request) => {
      const token = await createToken(request.em, app.services.box, request.caller, request.body, app.services.config.maxTokensPerOrganization);
      if (!token.reused) await listCache.changed(request.caller.organizationId);
      return { ...token, createdAt: iso(token.createdAt) };
    },
  );

  app.get(
    '/tokens',
    {
      config: { permission: 'tokens' },
      schema: {
        tags: ['tokens'],
        summary: 'List API tokens',
        querystring: z.object({ limit: limitQuery.optional() }),
        response: { 200: listEnvelope(TokenSummary) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listCache.list(request.em, request.caller.organizationId, request.query.limit);
      return list(
        items.map((t) => ({ id: t.id, name: t.name, last4: t.last4, permissions: t.permissions, createdAt: iso(t.createdAt) })),
        hasMore,
      );
    },
  );

  app.delete(
    '/tokens/:id',
    {
      config: { permission: 'tokens' },
      schema: {
        tags: ['tokens'],
        summary: 'Revoke an API token',
        description: 'Deletes the token. Its secret is refused (401) by every API process within 2 seconds. A token may revoke itself.',
        params: z.object({ id: z.string().min(1).max(100) }),
        response: { 200: z.object({ object: z.literal('token'), id: z.string(), deleted: z.literal(true) }) },
      },
    },
    async (request) => {
      const revoked = await revokeToken(request.em, request.caller.organizationId, request.params.id);
      // Drops this organization's entries from the list and authentication caches of every process.
      await listCache.changed(revoked.organizationId);
      return { object: 'token' as const, id: revoked.id, deleted: true as const };
    },
  );
}

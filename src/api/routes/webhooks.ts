import { z } from 'zod';
import { isWebhookEventType, WEBHOOK_EVENT_TYPES } from '../../shared/webhooks/events.js';
import {
  createWebhook,
  deleteWebhook,
  getWebhook,
  listDeliveries,
  listWebhooks,
  patchWebhook,
  retryDelivery,
  rotateWebhookSecret,
  sendTestEvent,
  type Delivery,
  type Webhook,
  type WebhookDeps,
} from '../../shared/webhooks/service.js';
import { iso, limitQuery, list, listEnvelope, Timestamp } from '../schemas.js';
import type { App } from '../types.js';

/** docs/webhooks.md "Input rules": `http` or `https`, nothing else (the host is checked by the service). */
const WebhookUrl = z
  .string()
  .trim()
  .max(2_048, 'at most 2048 characters')
  .refine((value) => {
    try {
      const url = new URL(value);
      return (url.protocol === 'http:' || url.protocol === 'https:') && url.hostname !== '';
    } catch {
      return false;
    }
  }, 'must be an http or https URL')
  // A password in the URL would be shown in every list of endpoints, to anyone with `settings`,
  // and never sent (fetch refuses credentials in a URL): the signature is the endpoint's proof.
  .refine((value) => {
    try {
      const url = new URL(value);
      return url.username === '' && url.password === '';
    } catch {
      return true;
    }
  }, 'must not hold a user name or password: verify the webhook-signature header instead (docs/webhooks.md)')
  .meta({ pattern: '^\\s*[Hh][Tt][Tt][Pp][Ss]?:' })
  .describe('The endpoint; http or https');

/** A non-empty list of event types, or `["*"]`; an unknown type is refused by name. */
const Events = z
  // The values in the JSON Schema (tools, OpenAPI); refused by name below, with a message of its own.
  .array(z.string().meta({ enum: [...WEBHOOK_EVENT_TYPES, '*'] }))
  .min(1, 'must name at least one event type, or "*"')
  .max(WEBHOOK_EVENT_TYPES.length + 1)
  .superRefine((events, ctx) => {
    events.forEach((type, index) => {
      if (type !== '*' && !isWebhookEventType(type)) {
        ctx.addIssue({ code: 'custom', path: [index], message: `unknown event type "${type}"` });
      }
    });
  })
  .transform((events) => (events.includes('*') ? ['*'] : [...new Set(events)]))
  .describe(`Event types: ${WEBHOOK_EVENT_TYPES.join(', ')}; or ["*"] for all`);

const Description = z.string().max(500, 'at most 500 characters').nullable();

/** The webhook lists' query (their tools take the same cursors). */
export const ListDeliveriesQuery = z.object({ limit: limitQuery.optional(), after: z.string().min(1).optional(), before: z.string().min(1).optional() });

export const CreateWebhookBody = z.strictObject({ url: WebhookUrl, events: Events, description: Description.optional() });
export const PatchWebhookBody = z.strictObject({
  url: WebhookUrl.optional(),
  events: Events.optional(),
  description: Description.optional(),
  enabled: z.boolean().optional(),
});

const WebhookShape = z.object({
  id: z.string(),
  url: z.string(),
  events: z.array(z.string()),
  description: z.string().nullable(),
  enabled: z.boolean(),
  disabledReason: z.string().nullable().describe('Why the endpoint was disabled, when it is'),
  createdAt: Timestamp,
  updatedAt: Timestamp,
});
const WebhookWithSecret = WebhookShape.extend({ secret: z.string().describe('whsec_…: shown only when created or rotated') });

const DeliveryShape = z.object({
  id: z.string().describe('msg_…: the webhook-id header of every attempt'),
  type: z.string(),
  status: z.enum(['pending', 'succeeded', 'failed']),
  attempts: z.number().int(),
  lastStatusCode: z.number().int().nullable(),
  lastError: z.string().nullable(),
  nextAttemptAt: Timestamp.nullable(),
  createdAt: Timestamp,
});

const WebhookParams = z.object({ id: z.string().min(1).max(100) });
const DeliveryParams = z.object({ id: z.string().min(1).max(100), msgId: z.string().min(1).max(100) });
const Deleted = z.object({ object: z.literal('webhook'), id: z.string(), deleted: z.literal(true) });

// The service's shapes already carry the API's fields; only their dates become text.
function present<T extends Webhook>(webhook: T): Omit<T, 'createdAt' | 'updatedAt'> & z.infer<typeof WebhookShape> {
  return { ...webhook, createdAt: iso(webhook.createdAt), updatedAt: iso(webhook.updatedAt) };
}

function presentDelivery(delivery: Delivery): z.infer<typeof DeliveryShape> {
  return { ...delivery, nextAttemptAt: iso(delivery.nextAttemptAt), createdAt: iso(delivery.createdAt) };
}

export async function webhooksRoutes(app: App): Promise<void> {
  const { services } = app;
  const deps = (request: { em: WebhookDeps['em'] }): WebhookDeps => ({
    em: request.em,
    box: services.box,
    dns: services.dns.fresh,
    allowPrivateUrls: services.config.webhookAllowPrivateUrls,
    maxEndpoints: services.config.maxWebhooksPerOrganization,
  });
  const config = { permission: 'settings' as const };
  const tags = ['webhooks'];

  app.post(
    '/webhooks',
    { config, schema: { tags, summary: 'Create a webhook endpoint (its secret is shown only here)', body: CreateWebhookBody, response: { 200: WebhookWithSecret } } },
    async (request) => {
      return present(await createWebhook(deps(request), request.caller.organizationId, request.body));
    },
  );

  app.get(
    '/webhooks',
    {
      config,
      schema: {
        tags,
        summary: 'List webhook endpoints, newest first',
        querystring: ListDeliveriesQuery.pick({ limit: true, after: true }),
        response: { 200: listEnvelope(WebhookShape) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listWebhooks(request.em, request.caller.organizationId, request.query);
      return list(items.map(present), hasMore);
    },
  );

  app.get(
    '/webhooks/:id',
    { config, schema: { tags, summary: 'Get a webhook endpoint', params: WebhookParams, response: { 200: WebhookShape } } },
    async (request) => present(await getWebhook(request.em, request.caller.organizationId, request.params.id)),
  );

  app.patch(
    '/webhooks/:id',
    { config, schema: { tags, summary: 'Update a webhook endpoint', params: WebhookParams, body: PatchWebhookBody, response: { 200: WebhookShape } } },
    async (request) => present(await patchWebhook(deps(request), request.caller.organizationId, request.params.id, request.body)),
  );

  app.delete(
    '/webhooks/:id',
    { config, schema: { tags, summary: 'Delete a webhook endpoint and its deliveries', params: WebhookParams, response: { 200: Deleted } } },
    async (request) => {
      await deleteWebhook(request.em, request.caller.organizationId, request.params.id);
      return { object: 'webhook' as const, id: request.params.id, deleted: true as const };
    },
  );

  app.post(
    '/webhooks/:id/secret',
    { config, schema: { tags, summary: 'Rotate the signing secret (the new one is shown only here)', params: WebhookParams, response: { 200: WebhookWithSecret } } },
    async (request) => {
      return present(await rotateWebhookSecret(deps(request), request.caller.organizationId, request.params.id));
    },
  );

  app.get(
    '/webhooks/:id/deliveries',
    {
      config,
      schema: {
        tags,
        summary: 'List the deliveries of a webhook endpoint, newest first',
        params: WebhookParams,
        querystring: ListDeliveriesQuery,
        response: { 200: listEnvelope(DeliveryShape) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listDeliveries(request.em, request.caller.organizationId, request.params.id, request.query);
      return list(items.map(presentDelivery), hasMore);
    },
  );

  app.post(
    '/webhooks/:id/deliveries/:msgId/retry',
    { config, schema: { tags, summary: 'Send a delivery again now', params: DeliveryParams, response: { 200: DeliveryShape } } },
    async (request) => presentDelivery(await retryDelivery(request.em, request.caller.organizationId, request.params.id, request.params.msgId)),
  );

  app.post(
    '/webhooks/:id/test',
    { config, schema: { tags, summary: 'Send a webhook.test event to the endpoint', params: WebhookParams, response: { 200: DeliveryShape } } },
    async (request) => presentDelivery(await sendTestEvent(request.em, request.caller.organizationId, request.params.id, services.clock())),
  );
}

import { z } from 'zod';
import { ONE_BODY_FIELD, SendEmailBody } from '../../shared/emails/input.js';
import type { Permission } from '../../shared/tokens/permissions.js';
import { ListCampaignsQuery, SendBody as SendCampaignBody } from '../routes/campaigns.js';
import { ListEmailsQuery } from '../routes/emails.js';
import { CreateBody as CreateSubscriberBody, ListSubscribersQuery, PatchBody as PatchSubscriberBody } from '../routes/subscribers.js';
import { VerifyBody } from '../routes/verification.js';
import { CreateWebhookBody, ListDeliveriesQuery } from '../routes/webhooks.js';
import { strictBody } from '../validation.js';
import { segment, type EndpointRequest } from './dispatch.js';

/**
 * One tool: the v2 endpoint it stands for, and the zod schema of its arguments (the
 * endpoint's own body schema wherever the route file exports it, plus path parameters).
 * Adding a tool is adding one `defineTool(...)` to `tools` below.
 */
export interface ToolDefinition<S extends z.ZodType> {
  name: string;
  description: string;
  /** The permission the endpoint asks (docs/foundation.md "Tokens and permissions"); the endpoint checks it, this only informs. */
  permission: Permission;
  inputSchema: S;
  /** Only reads: MCP `readOnlyHint`. */
  readOnly?: boolean;
  /** Sends or schedules mail: MCP `destructiveHint`. */
  destructive?: boolean;
  toRequest(args: z.input<S>): EndpointRequest;
}

export interface Tool {
  name: string;
  description: string;
  permission: Permission;
  inputSchema: z.ZodType;
  readOnly: boolean;
  destructive: boolean;
  /** JSON Schema of the arguments (zod 4 `toJSONSchema`, input side). */
  jsonSchema: Record<string, unknown>;
  /** The endpoint request for arguments already validated by `inputSchema`. */
  toRequest(args: unknown): EndpointRequest;
}

function defineTool<S extends z.ZodType>(definition: ToolDefinition<S>): Tool {
  // Unknown arguments are refused by the tool itself (path `arguments`, the message naming them, before dispatch), and
  // the published schema says so, as the endpoint refuses unknown body fields (validation.ts).
  const inputSchema = strictBody(definition.inputSchema) as z.ZodType;
  return {
    name: definition.name,
    description: definition.description,
    permission: definition.permission,
    inputSchema,
    readOnly: definition.readOnly ?? false,
    destructive: definition.destructive ?? false,
    jsonSchema: toJsonSchema(inputSchema),
    // Called only with arguments that passed `inputSchema` (see run.ts): the raw input, not
    // the parsed output, goes to the endpoint, which validates it again as any request.
    toRequest: (args) => definition.toRequest(args as z.input<S>),
  };
}

function toJsonSchema(schema: z.ZodType): Record<string, unknown> {
  const { $schema: _drop, ...json } = z.toJSONSchema(schema, { io: 'input', unrepresentable: 'any' }) as Record<string, unknown>;
  // MCP wants an object schema at the top.
  return { type: 'object', ...json };
}

// Tool arguments are JSON: a number, not the query string's coerced text.
const Limit = z.number().int().min(1).max(100);

const Id = (what: string) => z.string().min(1).describe(what);

// ---- The catalog: argument schemas are the route files' own exports wherever they exist ----

export const tools: Tool[] = [
  defineTool({
    name: 'verify_email',
    description:
      'Check whether an email address is worth sending to: syntax, disposable or suspicious domains, typos, history and DNS mail routing. Counts against the monthly verification quota.',
    permission: 'emails',
    inputSchema: VerifyBody,
    toRequest: (args) => ({ method: 'POST', url: '/api/v2/verify', body: args }),
  }),
  defineTool({
    name: 'send_email',
    description: 'Send one transactional email to one recipient. Give exactly one of html, markdown or tiptap. Answers the new email id.',
    permission: 'emails',
    inputSchema: SendEmailBody.safeExtend({
      idempotency_key: z.string().min(1).max(256).optional().describe('Sent as the Idempotency-Key header: a retry with the same key sends nothing more'),
    }).meta(ONE_BODY_FIELD),
    destructive: true,
    toRequest: ({ idempotency_key, ...body }) => ({
      method: 'POST',
      url: '/api/v2/emails',
      body,
      headers: { 'idempotency-key': idempotency_key },
    }),
  }),
  defineTool({
    name: 'get_email',
    description: 'Read one email by id, with its bodies and its derived last_event (queued, sent, delivered, opened, clicked, bounced, complained, failed).',
    permission: 'emails',
    inputSchema: z.object({ id: Id('Email id (eml_...)') }),
    readOnly: true,
    toRequest: ({ id }) => ({ method: 'GET', url: `/api/v2/emails/${segment(id)}` }),
  }),
  defineTool({
    name: 'list_emails',
    description: 'List transactional emails, newest first. Page with after (older than that id) or before (newer).',
    permission: 'emails',
    inputSchema: z.object({
      limit: Limit.optional().describe('1 to 100, default 20'),
      after: ListEmailsQuery.shape.after.describe('An email id: list emails older than it'),
      before: ListEmailsQuery.shape.before.describe('An email id: list emails newer than it'),
    }),
    readOnly: true,
    toRequest: (query) => ({ method: 'GET', url: '/api/v2/emails', query }),
  }),
  defineTool({
    name: 'create_subscriber',
    description: 'Create a subscriber, or update the one with that email (upsert), with tags and custom fields.',
    permission: 'subscribers',
    inputSchema: CreateSubscriberBody,
    toRequest: (body) => ({ method: 'POST', url: '/api/v2/subscribers', body }),
  }),
  defineTool({
    name: 'get_subscriber',
    description: 'Read one subscriber by id or email address, with its tags and custom fields.',
    permission: 'subscribers',
    inputSchema: z.object({ subscriber: Id('Subscriber id or email address') }),
    readOnly: true,
    toRequest: ({ subscriber }) => ({ method: 'GET', url: `/api/v2/subscribers/${segment(subscriber)}` }),
  }),
  defineTool({
    name: 'list_subscribers',
    description: 'List subscribers, newest first, optionally by status, tag name or a substring of email or name.',
    permission: 'subscribers',
    // The endpoint's own filters (a bad one is refused here, naming `arguments.…`).
    inputSchema: z.object({
      limit: Limit.optional().describe('1 to 100, default 20'),
      after: ListSubscribersQuery.shape.after.describe('A subscriber id: list subscribers older than it'),
      status: ListSubscribersQuery.shape.status,
      tag: ListSubscribersQuery.shape.tag.describe('A tag name'),
      query: ListSubscribersQuery.shape.query.describe('Substring of the email or the name'),
    }),
    readOnly: true,
    toRequest: (query) => ({ method: 'GET', url: '/api/v2/subscribers', query }),
  }),
  defineTool({
    name: 'update_subscriber',
    description: 'Change a subscriber (by id or email): email, name, phone, tags, custom fields. Omitted fields are unchanged.',
    permission: 'subscribers',
    inputSchema: PatchSubscriberBody.safeExtend({ subscriber: Id('Subscriber id or email address') }),
    toRequest: ({ subscriber, ...body }) => ({ method: 'PATCH', url: `/api/v2/subscribers/${segment(subscriber)}`, body }),
  }),
  defineTool({
    name: 'unsubscribe_subscriber',
    description: 'Unsubscribe a subscriber (by id or email) from all campaigns.',
    permission: 'subscribers',
    inputSchema: z.object({ subscriber: Id('Subscriber id or email address') }),
    toRequest: ({ subscriber }) => ({ method: 'POST', url: `/api/v2/subscribers/${segment(subscriber)}/unsubscribe`, body: {} }),
  }),
  defineTool({
    name: 'list_campaigns',
    description: 'List campaigns, newest first, optionally by status.',
    permission: 'campaigns',
    inputSchema: z.object({
      limit: Limit.optional().describe('1 to 100, default 20'),
      after: ListCampaignsQuery.shape.after,
      before: ListCampaignsQuery.shape.before,
      status: ListCampaignsQuery.shape.status,
    }),
    readOnly: true,
    toRequest: (query) => ({ method: 'GET', url: '/api/v2/campaigns', query }),
  }),
  defineTool({
    name: 'get_campaign',
    description: 'Read one campaign: content, status, schedule, recipient and engagement counts.',
    permission: 'campaigns',
    inputSchema: z.object({ campaignId: Id('Campaign id (cmp_...)') }),
    readOnly: true,
    toRequest: ({ campaignId }) => ({ method: 'GET', url: `/api/v2/campaigns/${segment(campaignId)}` }),
  }),
  defineTool({
    name: 'schedule_campaign',
    description:
      'Schedule a draft campaign for sending to its recipients, now (no scheduledAt) or at scheduledAt. The content must hold an unsubscribe link. This sends real email.',
    permission: 'send',
    inputSchema: SendCampaignBody.safeExtend({ campaignId: Id('Campaign id (cmp_...)') }),
    destructive: true,
    toRequest: ({ campaignId, ...body }) => ({ method: 'POST', url: `/api/v2/campaigns/${segment(campaignId)}/send`, body }),
  }),
  defineTool({
    name: 'list_domains',
    description: 'List the sending domains of the organization with their verification status.',
    permission: 'domains',
    inputSchema: z.object({ limit: Limit.optional().describe('Return at most this many') }),
    readOnly: true,
    toRequest: (query) => ({ method: 'GET', url: '/api/v2/domains', query }),
  }),
  defineTool({
    name: 'get_domain',
    description: 'Read one sending domain (by id or hostname) with the DNS records to publish and what verification still misses.',
    permission: 'domains',
    inputSchema: z.object({ domain: Id('Domain id (dom_...) or hostname') }),
    readOnly: true,
    toRequest: ({ domain }) => ({ method: 'GET', url: `/api/v2/domains/${segment(domain)}` }),
  }),
  defineTool({
    name: 'list_webhooks',
    description: 'List the webhook endpoints that receive the organization\'s events (email, contact, campaign, domain), newest first; no secrets.',
    permission: 'settings',
    inputSchema: z.object({
      limit: Limit.optional().describe('1 to 100, default 20'),
      after: ListDeliveriesQuery.shape.after.describe('A webhook id: list endpoints older than it'),
    }),
    readOnly: true,
    toRequest: (query) => ({ method: 'GET', url: '/api/v2/webhooks', query }),
  }),
  defineTool({
    name: 'create_webhook',
    description:
      'Register a URL to receive events (Standard Webhooks: signed POSTs, retried for about 28 hours). Answers the signing secret, shown only this once.',
    permission: 'settings',
    inputSchema: CreateWebhookBody,
    toRequest: (body) => ({ method: 'POST', url: '/api/v2/webhooks', body }),
  }),
  defineTool({
    name: 'list_webhook_deliveries',
    description: 'List the deliveries of one webhook endpoint, newest first: event type, status (pending, succeeded, failed), attempts, last HTTP status or error.',
    permission: 'settings',
    inputSchema: z.object({
      webhookId: Id('Webhook id (whk_...)'),
      limit: Limit.optional().describe('1 to 100, default 20'),
      after: ListDeliveriesQuery.shape.after.describe('A delivery id (msg_...): list deliveries older than it'),
      before: ListDeliveriesQuery.shape.before.describe('A delivery id (msg_...): list deliveries newer than it'),
    }),
    readOnly: true,
    toRequest: ({ webhookId, ...query }) => ({ method: 'GET', url: `/api/v2/webhooks/${segment(webhookId)}/deliveries`, query }),
  }),
  defineTool({
    name: 'send_test_webhook',
    description: 'Send a webhook.test event to one webhook endpoint, to check that it receives and verifies events.',
    permission: 'settings',
    inputSchema: z.object({ webhookId: Id('Webhook id (whk_...)') }),
    toRequest: ({ webhookId }) => ({ method: 'POST', url: `/api/v2/webhooks/${segment(webhookId)}/test` }),
  }),
];

export function findTool(name: string): Tool | undefined {
  return tools.find((tool) => tool.name === name);
}

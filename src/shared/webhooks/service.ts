import type { EntityManager } from '@mikro-orm/postgresql';
import { assertOneCursor } from '../db/cursor.js';
import type { SecretBox } from '../crypto.js';
import type { DnsLookup } from '../dns/types.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import { TEST_EVENT_TYPE } from './events.js';
import { lockForTransaction } from '../db/queries.js';
import {
  countEndpoints,
  deleteEndpoint,
  findEndpoint,
  hasMessage,
  insertEndpoint,
  insertTestMessage,
  listEndpoints,
  listMessages,
  retryMessage,
  updateEndpoint,
  type EndpointRow,
  type MessageRow,
} from './queries.js';
import { newWebhookSecret } from './signer.js';
import { hostOf, refusedHost } from './ssrf.js';

/** What the webhook functions need, passed explicitly (docs/architecture.md "Conventions"). */
export interface WebhookDeps {
  em: EntityManager;
  box: SecretBox;
  dns: DnsLookup;
  /** WEBHOOK_ALLOW_PRIVATE_URLS. */
  allowPrivateUrls: boolean;
  /** MAX_WEBHOOKS_PER_ORGANIZATION (the API's and the dashboard's routes); none when not given. */
  maxEndpoints?: number;
}

export interface Webhook {
  id: string;
  url: string;
  events: string[];
  description: string | null;
  enabled: boolean;
  disabledReason: string | null;
  createdAt: Date;
  updatedAt: Date;
}

export interface CreateWebhookInput {
  url: string;
  events: string[];
  description?: string | null;
}

export interface PatchWebhookInput {
  url?: string;
  events?: string[];
  description?: string | null;
  enabled?: boolean;
}

function toWebhook(row: EndpointRow): Webhook {
  return {
    id: row.id,
    url: row.url,
    events: row.events,
    description: row.description,
    enabled: row.enabled,
    disabledReason: row.disabled_reason,
    createdAt: new Date(row.created_at),
    updatedAt: new Date(row.updated_at),
  };
}

/**
 * The URL rules of docs/webhooks.md "Input rules" beyond its syntax (checked by the route's
 * schema): a host that resolves to a loopback, private, link-local or unique-local address is
 * refused unless WEBHOOK_ALLOW_PRIVATE_URLS; it is checked again at every connection (ssrf.ts).
 */
async function checkUrl(deps: WebhookDeps, url: string): Promise<void> {
  if (deps.allowPrivateUrls) return;
  const refused = await refusedHost(hostOf(new URL(url)), deps.dns);
  if (refused) throw new ValidationError(`The URL is refused: ${refused}`, [{ path: 'url', message: refused }]);
}

async function endpointOf(em: EntityManager, organizationId: string, id: string): Promise<EndpointRow> {
  const row = isId(id, 'whk') ? await findEndpoint(em, organizationId, id) : undefined;
  if (!row) throw new NotFoundError(`No webhook ${id}`);
  return row;
}

/** Creates an endpoint; its secret is answered here only (and by `rotateWebhookSecret`). */
export async function createWebhook(deps: WebhookDeps, organizationId: string, input: CreateWebhookInput): Promise<Webhook & { secret: string }> {
  await checkUrl(deps, input.url);
  const secret = newWebhookSecret();
  // A worker serves 64 endpoints at once, one job each: an organization's dead endpoints
  // (each holding its slot 10 s a post) must never take every slot from other organizations'.
  const row = await deps.em.transactional(async (tx) => {
    const max = deps.maxEndpoints ?? Number.POSITIVE_INFINITY;
    if (Number.isFinite(max)) await lockForTransaction(tx, `webhook-cap:${organizationId}`);
    const count = Number.isFinite(max) ? await countEndpoints(tx, organizationId) : 0;
    if (count >= max) {
      throw new ValidationError(`url: this organization has ${count} webhook endpoints, the most allowed (MAX_WEBHOOKS_PER_ORGANIZATION); delete one first`, [
        { path: 'url', message: 'too many webhook endpoints in this organization' },
      ]);
    }
    return insertEndpoint(tx, { id: newId('whk'), organizationId, url: input.url, events: input.events, description: input.description ?? null, secretSealed: deps.box.seal(secret) });
  });
  return { ...toWebhook(row), secret };
}

export async function getWebhook(em: EntityManager, organizationId: string, id: string): Promise<Webhook> {
  return toWebhook(await endpointOf(em, organizationId, id));
}

export async function listWebhooks(em: EntityManager, organizationId: string, query: { limit?: number; after?: string }): Promise<{ items: Webhook[]; hasMore: boolean }> {
  // Cursors as for emails (docs/foundation.md "Identifiers, time and lists"): an unknown one is 422.
  if (query.after !== undefined && !(isId(query.after, 'whk') && (await findEndpoint(em, organizationId, query.after)))) {
    throw new ValidationError(`after: no webhook ${query.after} in this organization`, [{ path: 'after', message: `no webhook ${query.after} in this organization` }]);
  }
  const limit = query.limit ?? 20;
  const rows = await listEndpoints(em, organizationId, { limit: limit + 1, after: query.after });
  return { items: rows.slice(0, limit).map(toWebhook), hasMore: rows.length > limit };
}

export async function patchWebhook(deps: WebhookDeps, organizationId: string, id: string, input: PatchWebhookInput): Promise<Webhook> {
  if (input.url !== undefined) {
    // An unknown endpoint is 404 before its new URL is resolved.
    await endpointOf(deps.em, organizationId, id);
    await checkUrl(deps, input.url);
  }
  const row = isId(id, 'whk') ? await updateEndpoint(deps.em, organizationId, id, input) : undefined;
  if (!row) throw new NotFoundError(`No webhook ${id}`);
  return toWebhook(row);
}

export async function deleteWebhook(em: EntityManager, organizationId: string, id: string): Promise<void> {
  if (!isId(id, 'whk') || !(await deleteEndpoint(em, organizationId, id))) throw new NotFoundError(`No webhook ${id}`);
}

/** A new secret, answered once; attempts from now on are signed with it. */
export async function rotateWebhookSecret(deps: Pick<WebhookDeps, 'em' | 'box'>, organizationId: string, id: string): Promise<Webhook & { secret: string }> {
  const secret = newWebhookSecret();
  // The update answers whether the endpoint exists: no select before it.
  const row = isId(id, 'whk') ? await updateEndpoint(deps.em, organizationId, id, { secretSealed: deps.box.seal(secret) }) : undefined;
  if (!row) throw new NotFoundError(`No webhook ${id}`);
  return { ...toWebhook(row), secret };
}

export interface Delivery {
  id: string;
  type: string;
  status: MessageRow['status'];
  attempts: number;
  lastStatusCode: number | null;
  lastError: string | null;
  nextAttemptAt: Date | null;
  createdAt: Date;
}

function toDelivery(row: MessageRow): Delivery {
  return {
    id: row.id,
    type: row.type,
    status: row.status,
    attempts: row.attempts,
    lastStatusCode: row.last_status_code,
    lastError: row.last_error,
    nextAttemptAt: row.next_attempt_at ? new Date(row.next_attempt_at) : null,
    createdAt: new Date(row.created_at),
  };
}

export async function listDeliveries(
  em: EntityManager,
  organizationId: string,
  id: string,
  query: { limit?: number; after?: string; before?: string },
): Promise<{ items: Delivery[]; hasMore: boolean }> {
  assertOneCursor(query);
  const endpoint = await endpointOf(em, organizationId, id);
  // Cursors as for emails (docs/foundation.md "Identifiers, time and lists"): an unknown one is 422.
  const cursor = query.after ?? query.before;
  if (cursor !== undefined && !(await hasMessage(em, endpoint.id, cursor))) {
    const field = query.after !== undefined ? 'after' : 'before';
    throw new ValidationError(`${field}: no delivery ${cursor} of webhook ${id}`, [{ path: field, message: `no delivery ${cursor} of webhook ${id}` }]);
  }
  const limit = query.limit ?? 20;
  const rows = await listMessages(em, endpoint.id, { limit: limit + 1, after: query.after, before: query.before });
  // `before` reads upwards: the extra row is the newest one, first in the reversed list.
  const items = query.before !== undefined ? rows.slice(Math.max(0, rows.length - limit)) : rows.slice(0, limit);
  return { items: items.map(toDelivery), hasMore: rows.length > limit };
}

export async function retryDelivery(em: EntityManager, organizationId: string, id: string, messageId: string): Promise<Delivery> {
  const endpoint = await endpointOf(em, organizationId, id);
  const row = await retryMessage(em, endpoint.id, messageId);
  if (!row) throw new NotFoundError(`No delivery ${messageId} of webhook ${id}`);
  return toDelivery(row);
}

/** A `webhook.test` event for this endpoint alone, whatever it subscribed to (a disabled one gets it once enabled). */
export async function sendTestEvent(em: EntityManager, organizationId: string, id: string, now: Date): Promise<Delivery> {
  const endpoint = await endpointOf(em, organizationId, id);
  const payload = { type: TEST_EVENT_TYPE, created_at: now.toISOString(), data: { webhook_id: endpoint.id, message: 'This is a test event from mailroom.' } };
  const row = await insertTestMessage(em, endpoint.id, newId('msg'), payload);
  if (!row) throw new NotFoundError(`No webhook ${id}`);
  return toDelivery(row);
}

/** How long deliveries are kept (the hourly purge-expired job, src/shared/retention/purge.ts). */
export const WEBHOOK_DELIVERY_RETENTION_MS = 30 * 24 * 3_600_000;

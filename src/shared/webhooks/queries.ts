import type { EntityManager } from '@mikro-orm/postgresql';

/**
 * The data access of webhooks: every statement on `webhook_endpoints` and
 * `webhook_messages` outside the outbox's inserts (outbox.ts) is here.
 */

export interface EndpointRow {
  id: string;
  organization_id: string;
  url: string;
  events: string[];
  description: string | null;
  enabled: boolean;
  disabled_reason: string | null;
  secret_sealed: string;
  failing_since: Date | null;
  created_at: Date;
  updated_at: Date;
}

export interface MessageRow {
  id: string;
  endpoint_id: string;
  type: string;
  status: 'pending' | 'succeeded' | 'failed';
  attempts: number;
  last_status_code: number | null;
  last_error: string | null;
  next_attempt_at: Date | null;
  created_at: Date;
}

type Db = Pick<EntityManager, 'execute'>;

// ---------------------------------------------------------------- endpoints

export async function insertEndpoint(
  em: Db,
  row: { id: string; organizationId: string; url: string; events: string[]; description: string | null; secretSealed: string },
): Promise<EndpointRow> {
  const [created] = await em.execute<EndpointRow[]>(
    `insert into webhook_endpoints (id, organization_id, url, events, description, secret_sealed)
     values (?, ?, ?, array(select jsonb_array_elements_text(?::jsonb)), ?, ?) returning *`,
    [row.id, row.organizationId, row.url, JSON.stringify(row.events), row.description, row.secretSealed],
    'all',
  );
  return created!;
}

export async function findEndpoint(em: Db, organizationId: string, id: string): Promise<EndpointRow | undefined> {
  const [row] = await em.execute<EndpointRow[]>('select * from webhook_endpoints where id = ? and organization_id = ?', [id, organizationId], 'all');
  return row;
}

export async function listEndpoints(em: Db, organizationId: string, options: { limit: number; after?: string }): Promise<EndpointRow[]> {
  return em.execute<EndpointRow[]>(
    `select * from webhook_endpoints where organization_id = ? and (?::text is null or id < ?) order by id desc limit ?`,
    [organizationId, options.after ?? null, options.after ?? null, options.limit],
    'all',
  );
}

export async function updateEndpoint(
  em: Db,
  organizationId: string,
  id: string,
  patch: { url?: string; events?: string[]; description?: string | null; enabled?: boolean; secretSealed?: string },
): Promise<EndpointRow | undefined> {
  const sets: string[] = [];
  const params: unknown[] = [];
  if (patch.url !== undefined) {
    sets.push('url = ?');
    params.push(patch.url);
  }
  if (patch.events !== undefined) {
    sets.push('events = array(select jsonb_array_elements_text(?::jsonb))');
    params.push(JSON.stringify(patch.events));
  }
  if (patch.description !== undefined) {
    sets.push('description = ?');
    params.push(patch.description);
  }
  if (patch.secretSealed !== undefined) {
    sets.push('secret_sealed = ?');
    params.push(patch.secretSealed);
  }
  if (patch.enabled !== undefined) {
    // Enabling again starts afresh: no reason, and the 5 days of failures count from zero.
    sets.push('enabled = ?');
    params.push(patch.enabled);
    if (patch.enabled) sets.push('disabled_reason = null, failing_since = null');
    else sets.push(`disabled_reason = 'disabled by the user'`);
  }
  sets.push('updated_at = now()');
  const [row] = await em.execute<EndpointRow[]>(
    `update webhook_endpoints set ${sets.join(', ')} where id = ? and organization_id = ? returning *`,
    [...params, id, organizationId],
    'all',
  );
  return row;
}

export async function deleteEndpoint(em: Db, organizationId: string, id: string): Promise<boolean> {
  const rows = await em.execute<{ id: string }[]>('delete from webhook_endpoints where id = ? and organization_id = ? returning id', [id, organizationId], 'all');
  return rows.length > 0;
}

// ---------------------------------------------------------------- deliveries (the API)

export async function listMessages(em: Db, endpointId: string, options: { limit: number; after?: string; before?: string }): Promise<MessageRow[]> {
  const columns = 'id, endpoint_id, type, status, attempts, last_status_code, last_error, next_attempt_at, created_at';
  if (options.before !== undefined) {
    // The `limit` items just newer than the cursor, still newest first (contract 3).
    const rows = await em.execute<MessageRow[]>(
      `select ${columns} from webhook_messages where endpoint_id = ? and id > ? order by id asc limit ?`,
      [endpointId, options.before, options.limit],
      'all',
    );
    return rows.reverse();
  }
  return em.execute<MessageRow[]>(
    `select ${columns} from webhook_messages where endpoint_id = ? and (?::text is null or id < ?) order by id desc limit ?`,
    [endpointId, options.after ?? null, options.after ?? null, options.limit],
    'all',
  );
}

/** `POST …/deliveries/{msgId}/retry`: due now, whatever its state; its attempts keep counting. */
export async function retryMessage(em: Db, endpointId: string, messageId: string): Promise<MessageRow | undefined> {
  const [row] = await em.execute<MessageRow[]>(
    `update webhook_messages set status = 'pending', next_attempt_at = now(), locked_until = null, updated_at = now()
     where id = ? and endpoint_id = ? returning *`,
    [messageId, endpointId],
    'all',
  );
  return row;
}

/** `POST …/test`: a `webhook.test` message for this endpoint alone. */
export async function insertTestMessage(em: Db, endpoint: EndpointRow, id: string, payload: unknown): Promise<MessageRow> {
  const [row] = await em.execute<MessageRow[]>(
    `insert into webhook_messages (id, endpoint_id, organization_id, type, payload, next_attempt_at)
     values (?, ?, ?, 'webhook.test', ?::jsonb, now()) returning *`,
    [id, endpoint.id, endpoint.organization_id, JSON.stringify(payload)],
    'all',
  );
  return row!;
}

// ---------------------------------------------------------------- the worker

/** Enabled endpoints that have a message due and not claimed (the dispatcher's scan). */
export async function endpointsWithDueMessages(em: Db, limit: number): Promise<string[]> {
  const rows = await em.execute<{ id: string }[]>(
    `select w.id from webhook_endpoints w
     where w.enabled and exists (
       select 1 from webhook_messages m
       where m.endpoint_id = w.id and m.status = 'pending' and m.next_attempt_at <= now()
         and (m.locked_until is null or m.locked_until < now()))
     limit ?`,
    [limit],
    'all',
  );
  return rows.map((r) => r.id);
}

export interface ClaimedMessage {
  id: string;
  type: string;
  payload: unknown;
  attempts: number;
}

/**
 * Claims up to `limit` due messages of one endpoint for `leaseMs`, oldest first. SKIP LOCKED
 * and the lease let several workers share an endpoint's backlog without taking a message
 * twice; a claimer that dies leaves its rows to be claimed again once the lease ends.
 */
export async function claimMessages(em: Db, endpointId: string, limit: number, leaseMs: number): Promise<ClaimedMessage[]> {
  return em.execute<ClaimedMessage[]>(
    `update webhook_messages m set locked_until = now() + (? * interval '1 millisecond')
     where m.id in (
       select id from webhook_messages
       where endpoint_id = ? and status = 'pending' and next_attempt_at <= now() and (locked_until is null or locked_until < now())
       order by next_attempt_at, id limit ? for update skip locked)
     returning m.id, m.type, m.payload, m.attempts`,
    [leaseMs, endpointId, limit],
    'all',
  );
}

export interface AttemptResult {
  id: string;
  status: 'pending' | 'succeeded' | 'failed';
  code: number | null;
  error: string | null;
  /** When pending: the next attempt. */
  next: string | null;
}

/** The outcomes of a batch of attempts, in one statement. */
export async function recordAttempts(em: Db, results: AttemptResult[]): Promise<void> {
  if (results.length === 0) return;
  await em.execute(
    `update webhook_messages m set status = v.status, attempts = m.attempts + 1, last_status_code = v.code, last_error = v.error,
       next_attempt_at = v.next, locked_until = null, updated_at = now()
     from jsonb_to_recordset(?::jsonb) as v(id text, status text, code int, error text, next timestamptz)
     where m.id = v.id`,
    [JSON.stringify(results)],
    'run',
  );
}

/**
 * The endpoint's health after a batch: any success clears its failing streak; a batch that
 * all failed starts one, and a streak older than `disableAfterMs` disables the endpoint.
 * Returns true when this call disabled it.
 */
export async function recordEndpointHealth(em: Db, endpointId: string, anySuccess: boolean, disableAfterMs: number, reason: string): Promise<boolean> {
  if (anySuccess) {
    await em.execute('update webhook_endpoints set failing_since = null where id = ? and failing_since is not null', [endpointId], 'run');
    return false;
  }
  const rows = await em.execute<{ enabled: boolean }[]>(
    `update webhook_endpoints set failing_since = coalesce(failing_since, now()),
       enabled = case when failing_since < now() - (? * interval '1 millisecond') then false else enabled end,
       disabled_reason = case when enabled and failing_since < now() - (? * interval '1 millisecond') then ? else disabled_reason end,
       updated_at = now()
     where id = ? and enabled returning enabled`,
    [disableAfterMs, disableAfterMs, reason, endpointId],
    'all',
  );
  return rows[0]?.enabled === false;
}

export async function loadEndpointForDelivery(em: Db, endpointId: string): Promise<Pick<EndpointRow, 'id' | 'url' | 'enabled' | 'secret_sealed'> | undefined> {
  const [row] = await em.execute<EndpointRow[]>('select id, url, enabled, secret_sealed from webhook_endpoints where id = ?', [endpointId], 'all');
  return row;
}


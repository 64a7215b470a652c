import type { EntityManager } from '@mikro-orm/postgresql';
import { isIP } from 'node:net';
import { Agent, request } from 'undici';
import type { SecretBox } from '../crypto.js';
import type { DnsLookup } from '../dns/types.js';
import type { Logger } from '../logger.js';
import { claimMessages, loadEndpointForDelivery, recordAttempts, recordEndpointHealth, releaseMessages, type AttemptResult } from './queries.js';
import { webhookHeaders } from './signer.js';
import { guardedLookup, hostOf, isPublicAddress } from './ssrf.js';

/**
 * docs/webhooks.md "Delivery and retries": after a failed attempt the next comes about 5 s, 5 min,
 * 30 min, 2 h, 5 h, 10 h and 10 h later (the Standard Webhooks reference schedule); after the
 * eighth attempt the message is `failed`. Each delay gets ±10 % jitter, so that an endpoint back
 * from an outage is not hit by its whole backlog in the same second.
 */
export const RETRY_SCHEDULE_MS = [5_000, 5 * 60_000, 30 * 60_000, 2 * 3_600_000, 5 * 3_600_000, 10 * 3_600_000, 10 * 3_600_000];
/** An endpoint whose every delivery has failed this long is disabled. */
export const DISABLE_AFTER_MS = 5 * 24 * 3_600_000;

/** The delay before the next attempt once `attemptsMade` attempts failed; undefined: no more. */
export function retryDelay(attemptsMade: number, random = Math.random): number | undefined {
  const base = RETRY_SCHEDULE_MS[attemptsMade - 1];
  return base === undefined ? undefined : Math.round(base * (0.9 + 0.2 * random()));
}

export interface WebhookClientOptions {
  dns: DnsLookup;
  allowPrivateUrls: boolean;
  /** A 2xx within this long is success (docs/webhooks.md "Delivery and retries": 10 s). */
  timeoutMs?: number;
  /** At most this much of an answer is read; the rest is discarded with the connection. */
  maxResponseBytes?: number;
  /** Connections kept to one endpoint: the per-endpoint concurrency. */
  connectionsPerOrigin?: number;
}

const AGENT_IDLE_MS = 60_000;

export interface PostResult {
  ok: boolean;
  statusCode: number | null;
  error: string | null;
}

/**
 * The HTTP side of delivery, on undici: one Agent per process (its pool per origin keeps
 * connections alive between attempts), no redirects (undici's `request` follows none), one
 * deadline for connect + answer, and the answer's body read only up to a cap. Connections
 * go only to addresses the SSRF guard accepts (a `lookup` hook for names, a check here for
 * literal addresses, which skip the lookup).
 */
export class WebhookClient {
  /** One Agent per endpoint: endpoints on one host (one origin) never share connections. */
  private readonly agents = new Map<string, { agent: Agent; usedAt: number }>();
  private readonly sweeper: NodeJS.Timeout;
  private readonly timeoutMs: number;
  private readonly maxResponseBytes: number;

  constructor(private readonly options: WebhookClientOptions) {
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.maxResponseBytes = options.maxResponseBytes ?? 64 * 1024;
    // An endpoint idle for a minute gives its connections back.
    this.sweeper = setInterval(() => {
      const idle = Date.now() - AGENT_IDLE_MS;
      for (const [key, entry] of this.agents) {
        if (entry.usedAt < idle) {
          this.agents.delete(key);
          void entry.agent.close().catch(() => {});
        }
      }
    }, AGENT_IDLE_MS);
    this.sweeper.unref();
  }

  private agentFor(endpointId: string): Agent {
    let entry = this.agents.get(endpointId);
    if (!entry) {
      const agent = new Agent({
        connections: this.options.connectionsPerOrigin ?? 16,
        headersTimeout: this.timeoutMs,
        bodyTimeout: this.timeoutMs,
        keepAliveTimeout: 4_000,
        connect: {
          timeout: this.timeoutMs,
          lookup: guardedLookup(this.options.dns, this.options.allowPrivateUrls),
        } as never,
      });
      entry = { agent, usedAt: Date.now() };
      this.agents.set(endpointId, entry);
    }
    entry.usedAt = Date.now();
    return entry.agent;
  }

  async post(endpointId: string, url: string, headers: Record<string, string>, body: string): Promise<PostResult> {
    let target: URL;
    try {
      target = new URL(url);
    } catch {
      return { ok: false, statusCode: null, error: 'invalid URL' };
    }
    const host = hostOf(target);
    if (!this.options.allowPrivateUrls && isIP(host) && !isPublicAddress(host)) {
      return { ok: false, statusCode: null, error: `refused: ${host} is not a public address` };
    }
    try {
      const response = await request(target, {
        dispatcher: this.agentFor(endpointId),
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/json', 'user-agent': 'mailroom-webhooks/1' },
        body,
        maxRedirections: 0,
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      // Read (and drop) at most the cap: a receiver answering gigabytes costs nothing more.
      await response.body.dump({ limit: this.maxResponseBytes }).catch(() => {});
      const ok = response.statusCode >= 200 && response.statusCode < 300;
      return { ok, statusCode: response.statusCode, error: ok ? null : `HTTP ${response.statusCode}` };
    } catch (error) {
      return { ok: false, statusCode: null, error: describe(error, this.timeoutMs) };
    }
  }

  async close(): Promise<void> {
    clearInterval(this.sweeper);
    await Promise.all([...this.agents.values()].map((e) => e.agent.close().catch(() => {})));
    this.agents.clear();
  }
}

function describe(error: unknown, timeoutMs: number): string {
  const e = error as { name?: string; code?: string; message?: string; cause?: { code?: string; message?: string } };
  if (e.name === 'TimeoutError' || e.code === 'UND_ERR_HEADERS_TIMEOUT' || e.code === 'UND_ERR_CONNECT_TIMEOUT' || e.code === 'UND_ERR_BODY_TIMEOUT') {
    return `no answer within ${timeoutMs / 1000} s`;
  }
  const code = e.code ?? e.cause?.code;
  const message = e.message ?? e.cause?.message ?? String(error);
  return (code ? `${code}: ${message}` : message).slice(0, 500);
}

export interface EndpointRunOptions {
  /** Messages claimed at once. */
  batch?: number;
  /** Requests in flight to the endpoint at once. */
  concurrency?: number;
  /** A claimed message is not claimed again before this (a claimer that died). */
  leaseMs?: number;
  /** One run stops claiming after this long, so a busy endpoint yields its worker slot. */
  maxRunMs?: number;
  /** The endpoint (URL, secret, enabled) is read again before a post once this old. */
  refreshMs?: number;
}

// A batch of 256 at 16 at a time takes at most 160 s against an endpoint that always times
// out: well within the lease. Large batches spread the claim and the write-back of outcomes
// (one statement each) over many deliveries.
const RUN_DEFAULTS: Required<EndpointRunOptions> = { batch: 256, concurrency: 16, leaseMs: 5 * 60_000, maxRunMs: 30_000, refreshMs: 1_000 };

export interface EndpointRunDeps {
  em: EntityManager;
  box: SecretBox;
  client: WebhookClient;
  clock: () => Date;
  log?: Logger;
}

/**
 * Delivers the due messages of one endpoint: claims a batch, posts it (at most
 * `concurrency` at once), writes the outcomes in one statement, and goes on until nothing
 * is due or `maxRunMs` has passed. Each endpoint runs in its own job, so a slow or dead one
 * holds only its own slot and never delays another's deliveries.
 */
export async function deliverEndpoint(deps: EndpointRunDeps, endpointId: string, options: EndpointRunOptions = {}): Promise<{ succeeded: number; failed: number }> {
  const o = { ...RUN_DEFAULTS, ...options };
  const counts = { succeeded: 0, failed: 0 };
  const started = Date.now();
  // After a success has cleared the endpoint's failing streak, later successes of this run
  // have nothing to clear.
  let healthy = false;
  // Read before every batch and again during one once `refreshMs` old (a batch against a slow
  // endpoint lasts minutes): a disable, a new URL or a rotated secret applies to every post
  // from a second after it on (docs/webhooks.md).
  const current = endpointReader(deps, endpointId, o.refreshMs);
  while (Date.now() - started < o.maxRunMs) {
    if (!(await current(true))?.enabled) break;
    const claimed = await claimMessages(deps.em, endpointId, o.batch, o.leaseMs);
    if (claimed.length === 0) break;
    const results = new Array<AttemptResult | undefined>(claimed.length);
    // Claimed and not posted: the endpoint was disabled or deleted during the batch.
    const unposted: string[] = [];
    await forEachLimit(claimed.length, o.concurrency, async (i) => {
      const message = claimed[i]!;
      const endpoint = await current(false);
      if (!endpoint?.enabled) {
        unposted.push(message.id);
        return;
      }
      const body = JSON.stringify(message.payload);
      const outcome = await deps.client.post(endpointId, endpoint.url, webhookHeaders(endpoint.secret, message.id, body, deps.clock()), body);
      const attempts = message.attempts + 1;
      if (outcome.ok) {
        results[i] = { id: message.id, status: 'succeeded', code: outcome.statusCode, error: null, next: null };
        return;
      }
      const delay = retryDelay(attempts);
      results[i] = {
        id: message.id,
        status: delay === undefined ? 'failed' : 'pending',
        code: outcome.statusCode,
        error: outcome.error,
        next: delay === undefined ? null : new Date(deps.clock().getTime() + delay).toISOString(),
      };
    });
    const attempted = results.filter((r): r is AttemptResult => r !== undefined);
    await recordAttempts(deps.em, attempted);
    const ok = attempted.filter((r) => r.status === 'succeeded').length;
    counts.succeeded += ok;
    counts.failed += attempted.length - ok;
    if (unposted.length > 0) {
      // Waiting as they were, for when it is enabled again (their attempts not counted).
      await releaseMessages(deps.em, unposted);
      break;
    }
    if (ok > 0 && healthy) continue;
    healthy = ok > 0;
    const last = attempted.find((r) => r.status !== 'succeeded');
    const disabled = await recordEndpointHealth(deps.em, endpointId, ok > 0, DISABLE_AFTER_MS, `every delivery failed for 5 days (last: ${last?.error ?? 'unknown'})`);
    if (disabled) {
      deps.log?.warn({ endpointId }, 'webhook endpoint disabled: every delivery failed for 5 days');
      break;
    }
  }
  return counts;
}

/**
 * The endpoint as it is (URL, opened secret, enabled; undefined once deleted): read again
 * when `fresh` is asked or the last read is `refreshMs` old, one read at a time for the
 * posts in flight.
 */
function endpointReader(deps: EndpointRunDeps, endpointId: string, refreshMs: number) {
  type Current = { url: string; secret: string; sealed: string; enabled: boolean } | undefined;
  let value: Current;
  let readAt = -Infinity;
  let reading: Promise<Current> | undefined;
  const read = async (): Promise<Current> => {
    const row = await loadEndpointForDelivery(deps.em, endpointId);
    if (!row) return (value = undefined);
    // Opened once per sealed secret, not once per read.
    const secret = value?.sealed === row.secret_sealed ? value.secret : deps.box.open(row.secret_sealed);
    value = { url: row.url, secret, sealed: row.secret_sealed, enabled: row.enabled };
    readAt = Date.now();
    return value;
  };
  return async (fresh: boolean): Promise<Current> => {
    if (!fresh && Date.now() - readAt < refreshMs) return value;
    reading ??= read().finally(() => (reading = undefined));
    return reading;
  };
}

/** Runs `task(0..count-1)` with at most `limit` running at once. */
async function forEachLimit(count: number, limit: number, task: (index: number) => Promise<void>): Promise<void> {
  let next = 0;
  const lane = async () => {
    while (next < count) await task(next++);
  };
  await Promise.all(Array.from({ length: Math.min(limit, count) }, lane));
}

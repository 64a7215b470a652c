import type { EntityManager } from '@mikro-orm/postgresql';
import type { ContentKind } from '../db/entities/email.js';
import type { Orm } from '../db/orm.js';
import { Coalescer } from './coalescer.js';
import { FenceLostError, type HandoverFence } from './handover.js';
import type { Logger } from '../logger.js';
import type { LinkSigner } from '../crypto.js';
import { personalizeCampaignEmail, type CampaignEmailParts } from '../campaigns/personalize.js';
import { mailboxDomain } from './addresses.js';
import { relayMessageId } from '../providers/relay-id.js';
import { renderEmail } from './render.js';
import { classifySendError, type MailTransport } from './transport.js';
import { COPIES_SQL, SKIPPED_RECIPIENTS_SQL, SUPPRESSED_SQL, TO_ADDRESS_SQL, type SendGate } from '../outcomes/send-gate.js';

/** The hand-over failed in a way that may succeed later: the job is retried. */
export class RetryLaterError extends Error {
  constructor(
    message: string,
    /** A provider throttle answer: retried later without ever failing the email. */
    readonly throttle: boolean,
  ) {
    super(message);
    this.name = 'RetryLaterError';
  }
}

export type DeliverOutcome =
  | { outcome: 'sent' | 'delivered'; messageId: string }
  | { outcome: 'failed'; reason: string }
  | { outcome: 'skipped'; status: string };

interface ClaimedRow extends CampaignEmailParts {
  id: string;
  organization_id: string;
  from_address: string;
  to_address: string;
  cc: string[] | null;
  bcc: string[] | null;
  reply_to: string[] | null;
  subject: string;
  content_kind: ContentKind;
  content: string;
  preview: string | null;
  text: string | null;
  headers: Record<string, string>;
  /** The organization's tracking settings. */
  track_opens: boolean;
  track_clicks: boolean;
  campaign_id: string | null;
  /** Suppressed recipients (bare addresses), left out of the SMTP envelope; null when none. */
  skip: string[] | null;
}

/** A claim: the row (now `sending`), the reason it was failed instead, or undefined when not queued. */
export type Claim = { row: ClaimedRow } | { failed: string } | undefined;

interface SentRecord {
  id: string;
  message_id: string;
  /** The relay's own id of the message, from its `250` answer (provider webhooks match by it). */
  provider_message_id?: string;
  html: string;
  text: string;
  /** A campaign email's personalised subject (its row holds the template's until sent). */
  subject?: string;
  delivered: boolean;
}

/** What is handed over: the row rendered (or, for a campaign email, personalised). */
interface Message {
  subject: string;
  html: string;
  text: string;
  headers: Record<string, string>;
}

const CLAIMED_COLUMNS = 'organization_id, from_address, to_address, cc, bcc, reply_to, subject, content_kind, content, preview, text, headers, campaign_id, subscriber_id';
// A campaign email's row has no body: its template (rendered once by the fan-out) and its
// subscriber come with the claim, to be personalised here.
const CAMPAIGN_PARTS = `t.subject as template_subject, t.html as template_html, t.text as template_text,
  s.name as subscriber_name, s.fields as subscriber_fields`;
const CAMPAIGN_JOINS = (alias: string) => `
  left join campaign_templates t on ${alias}.content_kind = 'campaign' and t.campaign_id = ${alias}.campaign_id
  left join subscribers s on ${alias}.content_kind = 'campaign' and s.id = ${alias}.subscriber_id`;
export const SUPPRESSED_REASON = 'suppressed';
const UNSUBSCRIBED_REASON = 'recipient no longer subscribed';

// The statements of the send path. Each is prepared once per connection (named): no parse
// and no plan per batch. Rows are found by primary key (`id = any($1)`): a join with a
// set-returning function of the ids was estimated at 100 rows and planned as a scan of every
// pending email, which made each batch cost milliseconds of PostgreSQL's CPU while a
// campaign or a backlog was queued.
const CLAIM_SQL = `
  with r as (
    select e.id, ${SUPPRESSED_SQL} as to_suppressed, ${TO_ADDRESS_SQL} as to_bare,
      case when e.cc is null and e.bcc is null then null else ${COPIES_SQL} end as copies,
      (e.source = 'campaign' and not exists (select 1 from subscribers s where s.id = e.subscriber_id and s.status = 'SUBSCRIBED')) as unsubscribed
    from emails e where e.id = any(?::text[]) and e.status = 'queued'),
  c as (
    select r.*, (r.to_suppressed and coalesce((r.copies ->> 'live')::int, 0) = 0) as suppressed,
      case when r.to_suppressed then jsonb_build_array(r.to_bare) || coalesce(r.copies -> 'skipped', '[]'::jsonb)
        else r.copies -> 'skipped' end as skip
    from r),
  failed as (
    update emails e set status = 'failed', updated_at = now(),
      failure_reason = case when c.suppressed then '${SUPPRESSED_REASON}' else '${UNSUBSCRIBED_REASON}' end
    from c where e.id = c.id and (c.suppressed or c.unsubscribed) and e.status = 'queued'
    returning e.id, e.failure_reason),
  claimed as (
    update emails e set status = 'sending', claimed_at = now(), attempts = e.attempts + 1, updated_at = now()
    from c where e.id = c.id and not (c.suppressed or c.unsubscribed) and e.status = 'queued'
    returning e.id, ${CLAIMED_COLUMNS.replace(/(\w+)/g, 'e.$1')})
  select cl.id, null as failed, ${CLAIMED_COLUMNS.replace(/(\w+)/g, 'cl.$1')}, o.track_opens, o.track_clicks, ${CAMPAIGN_PARTS}, c.skip
  from claimed cl join c on c.id = cl.id join organizations o on o.id = cl.organization_id ${CAMPAIGN_JOINS('cl')}
  union all
  select f.id, f.failure_reason, ${CLAIMED_COLUMNS.replace(/(\w+)/g, 'null')}, null, null, null, null, null, null, null, null from failed f`;

// Campaign counters move as the provider accepts (emailsSentCount, spec 2.5).
const SENT_SQL = `
  with sent as (update emails e set status = 'sent',
      delivery_status = case when v.delivered then 'delivered' else e.delivery_status end,
      message_id = v.message_id, provider_message_id = v.provider_message_id, html = v.html, text = v.text, subject = coalesce(v.subject, e.subject),
      sent_at = now(), failure_reason = null, updated_at = now()
    from jsonb_to_recordset(?::jsonb) as v(id text, message_id text, provider_message_id text, html text, text text, subject text, delivered boolean)
    where e.id = any(?::text[]) and e.id = v.id and e.status = 'sending'
    returning e.campaign_id, e.source)
  update campaigns c set emails_sent_count = c.emails_sent_count + s.n
  from (select campaign_id, count(*)::int as n from sent where source = 'campaign' and campaign_id is not null group by campaign_id) s
  where c.id = s.campaign_id`;

const RECLAIM_SQL = `
  with r as (
    update emails e set claimed_at = now(), attempts = e.attempts + 1, updated_at = now()
    from organizations o
    where e.id = ? and e.status = 'sending' and o.id = e.organization_id
    returning e.id, ${CLAIMED_COLUMNS.replace(/(\w+)/g, 'e.$1')}, o.track_opens, o.track_clicks, ${SKIPPED_RECIPIENTS_SQL} as skip)
  select r.*, ${CAMPAIGN_PARTS} from r ${CAMPAIGN_JOINS('r')}`;

/**
 * The status writes of the send path, group-committed: the claims (and the "sent" records)
 * of the jobs running at once in this process go to PostgreSQL as one statement, so the
 * database does one commit for many emails instead of two for each.
 */
export class DeliveryStore {
  private readonly claims: Coalescer<string, Claim>;
  private readonly sent: Coalescer<SentRecord, void>;

  constructor(
    private readonly orm: Orm,
    /** Without one (unit use), a `sending` row found by a job is never taken over. */
    readonly fence?: HandoverFence,
    /** Tracking of the HTML handed over and the count of suppressed emails; none without it. */
    readonly gate?: SendGate,
    /** Signs the unsubscribe links of campaign emails; without it they cannot be sent. */
    private readonly links?: { signer: LinkSigner; publicUrl: string },
  ) {
    this.claims = new Coalescer(async (ids) => {
      // The same id twice in one statement would be claimed once but returned to both
      // callers: only its first caller gets the row.
      const unique = [...new Set(ids)];
      // A suppressed recipient (contract 9) or campaign mail to a contact who unsubscribed
      // (or was deleted) since the fan-out (contract 8) is failed instead of claimed, in the
      // same statement, so it is never sent and the campaign still completes.
      const rows = await this.query<ClaimedRow & { failed: string | null }>('mailroom_emails_claim', CLAIM_SQL, [unique]);
      const byId = new Map(rows.map((r) => [r.id, r]));
      return ids.map((id): Claim => {
        const row = byId.get(id);
        byId.delete(id);
        if (!row) return undefined;
        return row.failed === null ? { row } : { failed: row.failed };
      });
    });
    this.sent = new Coalescer<SentRecord, void>(async (records) => {
      await this.query('mailroom_emails_sent', SENT_SQL, [JSON.stringify(records), records.map((r) => r.id)]);
      // The status says sent now: the fence keys have done their work (they expire anyway).
      await this.fence?.clear(records.map((r) => r.id)).catch(() => {});
      return records.map(() => undefined);
    });
  }

  /**
   * A prepared statement with bound parameters: the rendered bodies travel as a parameter
   * instead of being escaped into the SQL text (MikroORM's `execute` inlines).
   */
  private async query<T>(name: string, sql: string, params: unknown[]): Promise<T[]> {
    const knex = this.orm.em.getDriver().getConnection().getKnex();
    const result = (await knex.raw(sql, params as never[]).options({ name })) as { rows: T[] };
    return result.rows;
  }

  /** queued -> sending (or -> failed when it must not be sent); undefined when the row is not queued. */
  claim(id: string): Promise<Claim> {
    return this.claims.submit(id);
  }

  /**
   * Takes over a `sending` row whose job ran before and lost its lock (its worker died or
   * stalled): a new claim time and attempt; undefined when it is no longer `sending`.
   */
  async reclaim(id: string): Promise<ClaimedRow | undefined> {
    const [row] = await this.query<ClaimedRow>('mailroom_emails_reclaim', RECLAIM_SQL, [id]);
    return row;
  }

  /**
   * The message of a claimed row. A campaign email's template was rendered once by the
   * fan-out: it is only personalised here, not rendered again.
   */
  message(row: ClaimedRow): Message {
    if (row.content_kind === 'campaign') {
      if (!this.links) throw new Error('campaign mail needs the unsubscribe link signer');
      return personalizeCampaignEmail(row, this.links);
    }
    const rendered = renderEmail({ contentKind: row.content_kind, content: row.content, subject: row.subject, preview: row.preview, text: row.text });
    return { subject: row.subject, html: rendered.html, text: rendered.text, headers: row.headers };
  }

  markSent(record: SentRecord): Promise<void> {
    return this.sent.submit(record);
  }

  /** A rare write (failure, released claim): on its own. */
  async finish(id: string, set: string, params: unknown[]): Promise<void> {
    await this.orm.em.fork().execute(`update emails set ${set}, updated_at = now() where id = ? and status = 'sending'`, [...params, id], 'run');
  }

  async status(id: string): Promise<string> {
    const [row] = await this.orm.em.fork().execute<{ status: string }[]>('select status from emails where id = ?', [id], 'all');
    return row?.status ?? 'missing';
  }
}

/**
 * Hands one email to the provider at most once (contract 15). The row is claimed with a
 * conditional update (queued -> sending) before anything is sent, so a retry or a second
 * worker that finds it sent or failed sends nothing. A run that finds it `sending` (the
 * job's earlier run lost its lock: its worker died) asks the hand-over fence (handover.ts):
 * never committed -> taken over and sent; accepted -> only recorded; `dot` (the final `.`
 * may have reached the provider) -> left alone, never sent twice.
 *
 * - accepted: status sent (the file transport also marks it delivered), Message-ID, the
 *   rendered HTML and text stored;
 * - 5xx or a message that cannot be built: status failed with the reason;
 * - 4xx or a connection error: the claim is released (queued) and RetryLaterError thrown,
 *   unless `finalAttempt`, then failed.
 */
export async function deliverEmail(
  store: DeliveryStore,
  transport: MailTransport,
  emailId: string,
  options: { finalAttempt: boolean; log?: Logger },
): Promise<DeliverOutcome> {
  const claim = await store.claim(emailId);
  if (claim && 'failed' in claim) {
    if (claim.failed !== SUPPRESSED_REASON) return { outcome: 'skipped', status: 'failed' };
    store.gate?.suppressed();
    return { outcome: 'failed', reason: claim.failed };
  }
  let row = claim?.row;
  // The reclaim token when this run took the email over from a dead worker.
  let expected: string | undefined;
  if (!row) {
    const status = await store.status(emailId);
    if (status !== 'sending' || !store.fence) return { outcome: 'skipped', status };
    // Claimed by an earlier run of this job that lost its lock: its worker died (SIGKILL,
    // OOM, host lost) or stalled. The fence tells how far that hand-over got.
    const taken = await store.fence.reclaim(emailId);
    if ('current' in taken) {
      if (taken.current.startsWith('accepted:')) {
        // The provider has it; only the status write was lost.
        const accepted = await store.reclaim(emailId);
        if (!accepted) return { outcome: 'skipped', status: await store.status(emailId) };
        // The provider has it: recorded sent even if its campaign (and template) is gone since.
        let rendered: Message;
        try {
          rendered = store.message(accepted);
        } catch {
          rendered = { subject: accepted.subject, html: '', text: '', headers: accepted.headers };
        }
        const messageId = taken.current.slice('accepted:'.length);
        const delivered = transport.kind === 'file';
        await recordSent(store, sentRecord(emailId, messageId, accepted, rendered, delivered), options.log);
        options.log?.info({ emailId }, 'recorded the send of an email a dead worker had handed over');
        return { outcome: delivered ? 'delivered' : 'sent', messageId };
      }
      // `dot:`: the provider may or may not have it (never sent again: the reconciler fails
      // it after the lease); `reclaim:`: another worker took it over.
      options.log?.warn({ emailId, fence: taken.current.split(':')[0] }, 'email claimed by another worker; not sent again');
      return { outcome: 'skipped', status };
    }
    expected = taken.token;
    row = await store.reclaim(emailId);
    if (!row) return { outcome: 'skipped', status: await store.status(emailId) };
    options.log?.info({ emailId }, 'took over an email a dead worker had claimed but not handed over');
  }

  let rendered: Message;
  try {
    rendered = store.message(row);
  } catch (error) {
    const reason = `rendering failed: ${(error as Error).message}`.slice(0, 1000);
    await store.finish(emailId, `status = 'failed', failure_reason = ?`, [reason]);
    return { outcome: 'failed', reason };
  }

  if (row.skip && row.skip.length > 0) options.log?.info({ emailId, skipped: row.skip.length }, 'suppressed recipients left out');
  const decorate = store.gate?.decorator(emailId, { trackOpens: row.track_opens, trackClicks: row.track_clicks });
  const fromDomain = mailboxDomain(row.from_address);
  const messageId = `${row.id}@${fromDomain}`;
  const fence = store.fence;
  let fenceLost = false;
  let fenceError: unknown;
  let committed = false;
  let delivered: boolean;
  let response: string | undefined;
  try {
    ({ delivered, response } = await transport.send({
      id: row.id,
      organizationId: row.organization_id,
      from: row.from_address,
      to: row.to_address,
      cc: row.cc,
      bcc: row.bcc,
      replyTo: row.reply_to,
      subject: rendered.subject,
      // Open/click tracking is added to the HTML handed over only (the stored one has none).
      html: decorate ? decorate(rendered.html) : rendered.html,
      text: rendered.text,
      messageId,
      fromDomain,
      headers: rendered.headers,
      skipRecipients: row.skip ?? undefined,
      beforeCommit: fence
        ? async () => {
            let owned: boolean;
            try {
              owned = await fence.commit(emailId, expected);
            } catch (error) {
              fenceError = error;
              throw error;
            }
            if (!owned) {
              fenceLost = true;
              throw new FenceLostError(emailId);
            }
            committed = true;
          }
        : undefined,
    }));
  } catch (error) {
    // Another worker took the email over while this one was slow: it sends it, not us.
    if (fenceLost) return { outcome: 'skipped', status: 'sending' };
    if (fenceError !== undefined) {
      // Redis did not answer before the final `.`: nothing was handed over. The claim is
      // released and Redis's error rethrown, so the runner puts the job back without
      // spending an attempt (a Redis outage never fails an email).
      await store.finish(emailId, `status = 'queued'`, []);
      throw fenceError;
    }
    const { kind, reason } = classifySendError(error);
    if (committed && typeof (error as { responseCode?: unknown }).responseCode !== 'number') {
      // The final `.` went out but no answer came back (connection lost, timeout): the
      // provider may have the message. Failed rather than risk sending it twice.
      const ambiguous = `connection lost after the message was handed over (${reason}); not retried so that it is never sent twice`.slice(0, 1000);
      await store.finish(emailId, `status = 'failed', failure_reason = ?`, [ambiguous]);
      return { outcome: 'failed', reason: ambiguous };
    }
    if (kind === 'permanent' || (kind === 'transient' && options.finalAttempt)) {
      await store.finish(emailId, `status = 'failed', failure_reason = ?`, [reason]);
      return { outcome: 'failed', reason };
    }
    // Not handed over (or refused with an answer): release the claim so the retry can take
    // it again, and the fence with it.
    await fence?.clear([emailId]).catch(() => {});
    await store.finish(emailId, `status = 'queued', failure_reason = ?`, [reason]);
    throw new RetryLaterError(reason, kind === 'throttle');
  }

  // Recorded in Redis at once (one round trip), so that a worker dying before the
  // group-committed status write leaves an email the next run records instead of failing.
  await fence?.accepted(emailId, messageId).catch((error: unknown) => options.log?.warn({ err: error, emailId }, 'could not record the acceptance in the fence'));
  await recordSent(store, { ...sentRecord(emailId, messageId, row, rendered, delivered), provider_message_id: relayMessageId(response) }, options.log);
  return { outcome: delivered ? 'delivered' : 'sent', messageId };
}

function sentRecord(id: string, messageId: string, row: ClaimedRow, message: Message, delivered: boolean): SentRecord {
  const record: SentRecord = { id, message_id: messageId, html: message.html, text: message.text, delivered };
  if (row.content_kind === 'campaign') record.subject = message.subject;
  return record;
}

// After the provider accepted, the row must say so, or a later run would count it as an
// interrupted hand-over: the write is retried for about half a minute before giving up.
const RECORD_RETRIES = [200, 500, 1_000, 2_000, 5_000, 10_000, 15_000];

async function recordSent(store: DeliveryStore, record: SentRecord, log?: Logger): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await store.markSent(record);
      return;
    } catch (error) {
      const wait = RECORD_RETRIES[attempt];
      if (wait === undefined) {
        log?.error({ err: error, emailId: record.id }, 'the provider accepted the email but its status could not be recorded');
        throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }
}

/**
 * Reconciler, part 1: rows claimed (`sending`) longer ago than `leaseMs` were interrupted
 * mid hand-over (the worker died and its job is gone too). Those the fence says the
 * provider accepted are recorded sent; the others are failed rather than risk a duplicate.
 */
export async function failInterruptedEmails(em: EntityManager, leaseMs: number, fence?: HandoverFence): Promise<number> {
  const stale = await em.execute<{ id: string }[]>(
    `select id from emails where status = 'sending' and claimed_at < now() - (? * interval '1 millisecond') order by id limit 10000`,
    [leaseMs],
    'all',
  );
  if (stale.length === 0) return 0;
  const markers = fence ? await fence.readMany(stale.map((r) => r.id)) : [];
  const accepted = stale.flatMap((r, i) => (markers[i]?.startsWith('accepted:') ? [{ id: r.id, message_id: markers[i]!.slice('accepted:'.length) }] : []));
  if (accepted.length > 0) {
    await em.execute(
      `update emails e set status = 'sent', message_id = v.message_id, sent_at = now(), failure_reason = null, updated_at = now()
       from jsonb_to_recordset(?::jsonb) as v(id text, message_id text)
       where e.id = v.id and e.status = 'sending'`,
      [JSON.stringify(accepted)],
      'run',
    );
  }
  const acceptedIds = new Set(accepted.map((a) => a.id));
  const rest = stale.map((r) => r.id).filter((id) => !acceptedIds.has(id));
  if (rest.length === 0) return 0;
  const rows = await em.execute<{ id: string }[]>(
    `update emails set status = 'failed', updated_at = now(),
       failure_reason = 'interrupted while being handed to the provider; not retried so that it is never sent twice'
     where status = 'sending' and id in (select jsonb_array_elements_text(?::jsonb)) and claimed_at < now() - (? * interval '1 millisecond')
     returning id`,
    [JSON.stringify(rest), leaseMs],
    'all',
  );
  return rows.length;
}

/** Reconciler, part 2: one keyset page of queued emails older than `graceMs`. */
export async function queuedEmailsPage(
  em: EntityManager,
  options: { graceMs: number; afterId?: string; limit: number },
): Promise<{ id: string; source: 'api' | 'campaign' | 'test' }[]> {
  return em.execute(
    `select id, source from emails
     where status in ('queued', 'sending') and status = 'queued' and id > ? and created_at < now() - (? * interval '1 millisecond')
     order by id limit ?`,
    [options.afterId ?? '', options.graceMs, options.limit],
    'all',
  );
}

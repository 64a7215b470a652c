import type { EntityManager } from '@mikro-orm/postgresql';
import type { Orm } from '../db/orm.js';
import type { EmailSource } from '../db/entities/email.js';
import { Coalescer } from './coalescer.js';
import { FenceLostError, type HandoverFence } from './handover.js';
import type { Logger } from '../logger.js';
import type { LinkSigner } from '../crypto.js';
import { personalizeCampaignEmail } from '../campaigns/personalize.js';
import { mailboxDomain, parseMailbox } from './addresses.js';
import { relayMessageId } from '../providers/relay-id.js';
import { renderEmail, type Rendered, type RenderInput } from './render.js';
import { classifySendError, type MailTransport, type SendResult } from './transport.js';
import { loadSubmittedParts } from '../submission/queries.js';
import type { SendGate } from '../outcomes/send-gate.js';
import {
  claimEmails,
  emailStatus,
  failClaimedEmails,
  INTERRUPTED_REASON,
  markStaleClaimsSent,
  queuedEmailsPage,
  reclaimEmail,
  recordSent,
  releaseClaimedEmail,
  staleClaims,
  SUPPRESSED_REASON,
  UNCERTAIN_REASON,
  UNSUBSCRIBED_REASON,
  type ClaimedRow,
  type SentRecord,
} from './queries.js';

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

/** A claim: the row (now `sending`), the reason it was failed instead, or undefined when not queued. */
export type Claim = { row: ClaimedRow } | { failed: string } | undefined;

/** What is handed over: the row rendered (or, for a campaign email, personalised). */
interface Message {
  subject: string;
  html: string;
  text: string;
  headers: Record<string, string>;
}

// The fence's answer before the final `.` must come well within the send job's lock
// (10 s, renewed every 5 s), so that no other worker can have taken the email over.
const PREPARE_MAX_MS = 2_000;
// A `pre:` is followed by its `dot:` in the same turn of the event loop; one this old was
// left by a worker that died before writing its `.`, and the reconciler may seize it.
const PRE_SETTLED_MS = 60_000;

// One claim statement and one "sent" statement in flight at a time: the jobs that need one
// meanwhile wait for it and go together in the next. Against four in flight
// (bench/README.md, bench:deliver on the quiet machine): 1,321-1,334 emails/s against
// 1,085-1,127, half the commits (0.14 an email against 0.28) and about half the PostgreSQL
// CPU an email; every statement is a round trip to another process, the dearest thing the
// send path does on a small VM. A DKIM-signed campaign: 878 emails/s against 735.
const WRITES_IN_FLIGHT = 1;

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
    /** Renders an email's body (off-loop.ts: in the delivery thread); on the event loop without it. */
    private readonly render: (input: RenderInput) => Promise<Rendered> = async (input) => renderEmail(input),
  ) {
    this.claims = new Coalescer(async (ids) => {
      // The same id twice in one statement would be claimed once but returned to both
      // callers: only its first caller gets the row.
      const found = await claimEmails(this.orm.em, [...new Set(ids)]);
      const byId = new Map(found.map((r) => [r.id, r]));
      return ids.map((id): Claim => {
        const row = byId.get(id);
        byId.delete(id);
        if (!row) return undefined;
        return row.failed === null ? { row } : { failed: row.failed };
      });
    }, WRITES_IN_FLIGHT);
    this.sent = new Coalescer<SentRecord, void>(async (records) => {
      // The webhook outbox rows (email.sent / email.delivered) commit with the status write.
      await recordSent(this.orm.em, records);
      // The status says sent now: the fence keys have done their work (they expire anyway).
      // Not awaited: with one write in flight, the next group's statement does not wait for
      // this Redis round trip.
      void this.fence?.clear(records.map((r) => r.id)).catch(() => {});
      return records.map(() => undefined);
    }, WRITES_IN_FLIGHT);
  }

  /** queued -> sending (or -> failed when it must not be sent); undefined when the row is not queued. */
  claim(id: string): Promise<Claim> {
    return this.claims.submit(id);
  }

  /**
   * Takes over a `sending` row whose job ran before and lost its lock (its worker died or
   * stalled): a new claim time and attempt; undefined when it is no longer `sending`.
   */
  reclaim(id: string): Promise<ClaimedRow | undefined> {
    return reclaimEmail(this.orm.em, id);
  }

  /**
   * The message of a claimed row. A campaign email's template was rendered once by the
   * fan-out: it is only personalised here, not rendered again.
   */
  async message(row: ClaimedRow): Promise<Message> {
    if (row.content_kind === 'campaign') {
      if (!this.links) throw new Error('campaign mail needs the unsubscribe link signer');
      return personalizeCampaignEmail(row, this.links);
    }
    // Submitted over SMTP: sent as it came (an empty part is left out).
    if (row.content_kind === 'message') return { subject: row.subject, html: row.content, text: row.text ?? '', headers: row.headers };
    const rendered = await this.render({ contentKind: row.content_kind, content: row.content, subject: row.subject, preview: row.preview, text: row.text });
    return { subject: row.subject, html: rendered.html, text: rendered.text, headers: row.headers };
  }

  /** The envelope, headers and attachments of a message submitted over SMTP. */
  submitted(id: string) {
    return loadSubmittedParts(this.orm.em.fork(), id);
  }

  markSent(record: SentRecord): Promise<void> {
    return this.sent.submit(record);
  }

  /**
   * A claimed email failed (a rare write: on its own), with its `email.failed` webhook;
   * `message` when it was rendered for the provider (stored as a sent email's is).
   */
  async fail(id: string, reason: string, message?: StoredMessage): Promise<void> {
    await failClaimedEmails(this.orm.em, [id], reason, 0, message);
  }

  /** A claimed email given back to the queue, with the reason of the failed attempt when there is one. */
  release(id: string, reason?: string): Promise<void> {
    return releaseClaimedEmail(this.orm.em, id, reason);
  }

  status(id: string): Promise<string> {
    return emailStatus(this.orm.em, id);
  }
}

/**
 * Hands one email to the provider at most once (docs/emails.md "Delivery, retries, exactly once").
 * The row is claimed with a conditional update (queued -> sending) before anything is sent, so a
 * retry or a second worker that finds it sent or failed sends nothing. A run that finds it
 * `sending` (the job's earlier run lost its lock: its worker died) asks the hand-over fence
 * (handover.ts): never committed -> taken over and sent; accepted -> only recorded; `dot` (the
 * final `.` may have reached the provider) -> left alone, never sent twice.
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
    // Failed by the claim (queries.ts): suppressed (counted by the send gate), or a campaign
    // email whose contact is no longer subscribed.
    if (claim.failed === SUPPRESSED_REASON) store.gate?.suppressed();
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
          rendered = await store.message(accepted);
        } catch {
          rendered = { subject: accepted.subject, html: '', text: '', headers: accepted.headers };
        }
        const messageId = taken.current.slice('accepted:'.length);
        const delivered = transport.kind === 'file';
        await recordSentWithRetries(store, sentRecord(emailId, messageId, accepted, rendered, delivered), options);
        options.log?.info({ emailId }, 'recorded the send of an email a dead worker had handed over');
        return { outcome: delivered ? 'delivered' : 'sent', messageId };
      }
      // `dot:`: the final `.` was written and the answer never read: the provider may or may
      // not have it. Never sent again; failed at once with a reason of its own, so that an
      // operator can find these few (and a late answer of a worker that only stalled still
      // records it sent).
      await store.fail(emailId, UNCERTAIN_REASON);
      options.log?.warn({ emailId, fence: taken.current.split(':')[0] }, 'email handed over by a dead worker without an answer; failed as uncertain, not sent again');
      return { outcome: 'failed', reason: UNCERTAIN_REASON };
    }
    expected = taken.token;
    row = await store.reclaim(emailId);
    if (!row) return { outcome: 'skipped', status: await store.status(emailId) };
    options.log?.info({ emailId }, 'took over an email a dead worker had claimed but not handed over');
  }

  let rendered: Message;
  try {
    rendered = await store.message(row);
  } catch (error) {
    const reason = `rendering failed: ${(error as Error).message}`.slice(0, 1000);
    await store.fail(emailId, reason);
    return { outcome: 'failed', reason };
  }

  if (row.skip && row.skip.length > 0) options.log?.info({ emailId, skipped: row.skip.length }, 'suppressed recipients left out');
  const decorate = store.gate?.decorator(emailId, { trackOpens: row.track_opens, trackClicks: row.track_clicks });
  const fromDomain = mailboxDomain(row.from_address);
  const messageId = `${row.id}@${fromDomain}`;
  const fence = store.fence;
  let fenceLost = false;
  let fenceSlow = false;
  let fenceError: unknown;
  // The `pre:` value of the fence once this worker may commit, and whether the final `.`
  // was released to the socket (the precise point after which the provider may have it).
  let prepared: string | undefined;
  let dotWritten = false;
  let acceptance: Promise<unknown> | undefined;
  let delivered: boolean;
  let response: string | undefined;
  let refused: SendResult['refused'];
  try {
    // Read inside the try: a failed read releases the claim and retries like a failed send.
    const submitted = row.content_kind === 'message' ? await store.submitted(row.id) : undefined;
    ({ delivered, response, refused } = await transport.send({
      id: row.id,
      organizationId: row.organization_id,
      from: row.from_address,
      to: row.to_address,
      cc: row.cc,
      bcc: row.bcc,
      replyTo: row.reply_to,
      subject: rendered.subject,
      // Open/click tracking is added to the HTML handed over only (the stored one has none).
      html: decorate && rendered.html ? decorate(rendered.html) : rendered.html,
      text: rendered.text,
      messageId,
      fromDomain,
      headers: rendered.headers,
      skipRecipients: row.skip ?? undefined,
      submitted,
      beforeCommit: fence
        ? async () => {
            const asked = performance.now();
            try {
              prepared = await fence.prepare(emailId, expected);
            } catch (error) {
              fenceError = error;
              throw error;
            }
            if (!prepared) {
              fenceLost = true;
              throw new FenceLostError(emailId);
            }
            // The answer came so late that this job's lock may have expired meanwhile (the
            // event loop stalled): another worker may be about to take the email over, so
            // the `.` is not written (the DATA is aborted and the email given back).
            if (performance.now() - asked > PREPARE_MAX_MS) {
              fenceSlow = true;
              throw new Error('the hand-over fence answered too late; not committed');
            }
          }
        : undefined,
      onCommit: fence
        ? () => {
            dotWritten = true;
            void fence.dot(emailId, prepared!).catch((error: unknown) => options.log?.warn({ err: error, emailId }, 'could not record the final dot in the fence'));
          }
        : () => {
            dotWritten = true;
          },
      // Recorded in Redis in the turn that read the answer, so that a worker dying before the
      // group-committed status write leaves an email the next run records instead of failing.
      onAccepted: fence ? () => (acceptance = fence.accepted(emailId, messageId)) : undefined,
    }));
  } catch (error) {
    // Another worker took the email over while this one was slow: it sends it, not us.
    if (fenceLost) return { outcome: 'skipped', status: 'sending' };
    if (fenceSlow) {
      // Still ours (nobody took it over): given back and retried; else the other worker sends it.
      if (!(await fence!.release(emailId, prepared!))) return { outcome: 'skipped', status: 'sending' };
      await store.release(emailId);
      throw new RetryLaterError('the hand-over fence answered too late', false);
    }
    if (fenceError !== undefined) {
      // Redis did not answer before the final `.`: nothing was handed over. The claim is
      // released and Redis's error rethrown, so the runner puts the job back without
      // spending an attempt (a Redis outage never fails an email).
      await store.release(emailId);
      throw fenceError;
    }
    const { kind, reason } = classifySendError(error);
    if (dotWritten && typeof (error as { responseCode?: unknown }).responseCode !== 'number') {
      // The final `.` went out but no answer came back (connection lost, timeout): the
      // provider may have the message. Failed as uncertain rather than risk sending it twice.
      const uncertain = `${UNCERTAIN_REASON} (${reason})`.slice(0, 1000);
      await store.fail(emailId, uncertain, storedMessage(row, rendered));
      return { outcome: 'failed', reason: uncertain };
    }
    if (kind === 'permanent' || (kind === 'transient' && options.finalAttempt)) {
      await store.fail(emailId, reason, storedMessage(row, rendered));
      return { outcome: 'failed', reason };
    }
    // Not handed over (or refused with an answer): release the claim so the retry can take
    // it again, and the fence with it.
    await fence?.clear([emailId]).catch(() => {});
    await store.release(emailId, reason);
    throw new RetryLaterError(reason, kind === 'throttle');
  }

  await (acceptance ?? fence?.accepted(emailId, messageId))?.catch((error: unknown) => options.log?.warn({ err: error, emailId }, 'could not record the acceptance in the fence'));
  if (refused) {
    const to = (parseMailbox(row.to_address)?.address ?? row.to_address).toLowerCase();
    const refusedTo = refused.find((r) => r.address.toLowerCase() === to);
    if (refusedTo) {
      // The relay took the message for the copies and refused the `to`: the email reads as its
      // message to the `to` did (docs/emails.md "Delivery, retries, exactly once"), failed with
      // the relay's answer, as when the `to` alone is refused. Never retried, even after a 4xx:
      // the copies have it already.
      await store.fail(emailId, refusedTo.reason, storedMessage(row, rendered));
      void fence?.clear([emailId]).catch(() => {});
      options.log?.warn({ emailId, refused }, 'the relay refused the recipient and took the copies');
      return { outcome: 'failed', reason: refusedTo.reason };
    }
    options.log?.warn({ emailId, refused }, 'the relay refused copies of the email');
  }
  await recordSentWithRetries(store, { ...sentRecord(emailId, messageId, row, rendered, delivered), provider_message_id: relayMessageId(response) }, options);
  return { outcome: delivered ? 'delivered' : 'sent', messageId };
}

/** What an email's row keeps of the message handed over: the rendered parts, and a campaign email's personalised subject. */
type StoredMessage = Pick<SentRecord, 'html' | 'text' | 'subject'>;

function storedMessage(row: ClaimedRow, message: Message): StoredMessage {
  return { html: message.html, text: message.text, ...(row.content_kind === 'campaign' ? { subject: message.subject } : {}) };
}

function sentRecord(id: string, messageId: string, row: ClaimedRow, message: Message, delivered: boolean): SentRecord {
  return { id, message_id: messageId, ...storedMessage(row, message), delivered };
}

// After the provider accepted, the row must say so, or a later run would count it as an
// interrupted hand-over: the write is retried for about half a minute before giving up.
const RECORD_RETRIES = [200, 500, 1_000, 2_000, 5_000, 10_000, 15_000];

// `options.log` is read only when something is logged: a job's logger is made on first use
// (workers/runner.ts), and making one for every email sent cost a child logger each.
async function recordSentWithRetries(store: DeliveryStore, record: SentRecord, options: { log?: Logger }): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await store.markSent(record);
      return;
    } catch (error) {
      const wait = RECORD_RETRIES[attempt];
      if (wait === undefined) {
        options.log?.error({ err: error, emailId: record.id }, 'the provider accepted the email but its status could not be recorded');
        throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }
}

/**
 * Reconciler, part 1: rows claimed (`sending`) longer ago than `leaseMs` were interrupted
 * mid hand-over and their job is gone too (a dead worker's job normally comes back within
 * seconds and settles the email itself). By the fence: `accepted:` is recorded sent (its
 * campaign counted); `dot:` is failed as uncertain; `pre:` or `reclaim:` (the `.` never
 * written) is seized (a `reclaim:` of the reconciler, so a worker that only stalled can never
 * commit it) and answered in `takeOver`, for a new send job to take it over like any
 * dead worker's email (a `pre:` or `reclaim:` written too recently is not seized: see
 * HandoverFence#seize); no key at all (Redis lost it) is seized too, then failed rather than
 * risk a duplicate. Without a fence, every stale row is failed as interrupted.
 */
export async function failInterruptedEmails(
  em: EntityManager,
  leaseMs: number,
  fence?: HandoverFence,
): Promise<{ failed: number; takeOver: { id: string; source: EmailSource }[] }> {
  const stale = await staleClaims(em, leaseMs);
  if (stale.length === 0) return { failed: 0, takeOver: [] };
  const found = fence ? await fence.seize(stale.map((row) => row.id), { preAgeMs: PRE_SETTLED_MS, reclaimAgeMs: leaseMs }) : [];
  const accepted: { id: string; message_id: string }[] = [];
  const takeOver: { id: string; source: EmailSource }[] = [];
  const uncertain: string[] = [];
  const rest: string[] = [];
  stale.forEach((row, i) => {
    const { seized, found: marker } = found[i] ?? { seized: false, found: '' };
    if (marker.startsWith('accepted:')) accepted.push({ id: row.id, message_id: marker.slice('accepted:'.length) });
    else if (marker.startsWith('dot:')) uncertain.push(row.id);
    // A young `pre:` (not seized) is left to the next run.
    else if (marker.startsWith('pre:')) {
      if (seized) takeOver.push(row);
    }
    // A `reclaim:`, seized or too young to seize (a take-over under way, or this
    // reconciler's own from its last run): requeueMissing adds a job only when none is
    // waiting or running.
    else if (marker.startsWith('reclaim:')) takeOver.push(row);
    else rest.push(row.id);
  });
  await markStaleClaimsSent(em, accepted);
  const failed = (await failClaimedEmails(em, uncertain, UNCERTAIN_REASON, leaseMs)) + (await failClaimedEmails(em, rest, INTERRUPTED_REASON, leaseMs));
  return { failed, takeOver };
}

export { queuedEmailsPage, SUPPRESSED_REASON, UNCERTAIN_REASON, UNSUBSCRIBED_REASON };

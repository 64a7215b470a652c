import type { EntityManager } from '@mikro-orm/postgresql';
import type { CampaignStatus } from '../db/entities/campaign.js';
import { enqueueEmailSends, SEND_JOB_OPTIONS } from '../emails/service.js';
import { newId } from '../ids.js';
import type { Logger } from '../logger.js';
import type { Metrics } from '../metrics.js';
import type { QueueProducer } from '../queues/producer.js';
import { renderCampaignTemplate } from './content.js';
import {
  countCampaignEmails,
  hasPendingEmails,
  insertTemplate,
  lockSendingCampaign,
  markFanOutDone,
  selectActiveCampaigns,
  selectCampaign as loadCampaign,
  selectQueuedCampaignEmails,
  selectSender,
  templateExists,
  updateCampaignStatus,
  writeFanOutPage,
  type CampaignRow,
} from './queries.js';
import { CAMPAIGN_JOB_OPTIONS, formatFrom } from './service.js';
import { assertTransition } from './state.js';
import { sendingPolicyProblem, type PolicyConfig } from '../domains/sending-policy.js';
import { recordCampaignSent } from '../webhooks/queries.js';

/**
 * The fan-out of a campaign (docs/campaigns.md "Fan-out"), resumable
 * (docs/architecture.md "Conventions"). The campaign's message is rendered ONCE, placeholders left
 * in, into `campaign_templates`; each recipient's row is written without a body (content kind
 * `campaign`) and personalised by the send path when it claims the row (emails/deliver.ts).
 * Recipients are read by keyset pages of subscriber id, set-based: ONE statement per page locks the
 * campaign row (a concurrent delete waits, or the page sees it gone), selects the page, inserts its
 * rows and moves the campaign's cursor to the page's last subscriber id, so a worker killed
 * anywhere resumes after the last committed page. Rows are inserted with `on conflict do nothing`
 * on the unique (campaign_id, subscriber_id): nobody gets two. After each page the page's sends go
 * to `campaign-emails` as `send-batch` jobs (one per 1,000 emails) that the send workers expand
 * into one `send` job per email (jobId = email id); on resume, the queued rows of the campaign are
 * enqueued again, one job per email (an email's job that still exists is not duplicated, and the
 * claim never sends a row twice).
 */
export interface FanOutDeps {
  producer: QueueProducer;
  logger: Logger;
  metrics?: Metrics;
  pageSize: number;
  now: () => Date;
  /** The sending policy, checked again when the fan-out starts (a domain may have lost its verification). */
  policy: PolicyConfig;
}

async function setStatus(em: EntityManager, id: string, from: CampaignStatus, to: CampaignStatus, stamp?: 'send_at' | 'finished_at'): Promise<boolean> {
  assertTransition(from, to);
  return updateCampaignStatus(em, id, from, to, stamp);
}

export type FanOutResult = 'gone' | 'not-due' | 'done' | 'failed-no-sender';

/** What the `send-batch` payload takes at most (queues/registry.ts). */
const SEND_BATCH = 1_000;

export async function runFanOut(em: EntityManager, deps: FanOutDeps, campaignId: string): Promise<FanOutResult> {
  let campaign = await loadCampaign(em, campaignId);
  if (!campaign) return 'gone';
  if (campaign.status === 'SCHEDULED') {
    // SCHEDULED -> SENDING: sendAt is when the worker started it.
    if (!(await setStatus(em, campaignId, 'SCHEDULED', 'SENDING', 'send_at'))) return 'gone';
    campaign = { ...campaign, status: 'SENDING' };
  } else if (campaign.status !== 'SENDING') {
    return 'not-due';
  }
  if (campaign.fanout_done) {
    await enqueueCompletion(deps, campaignId);
    return 'done';
  }
  if (campaign.fanout_cursor !== null) await requeueQueued(em, deps, campaignId);

  const sender = await selectSender(em, campaign.sender_id ?? '', campaign.organization_id);
  const refused = sender ? await sendingPolicyProblem(em, deps.policy, campaign.organization_id, sender.email) : 'its sender no longer exists';
  if (!sender || refused) {
    await setStatus(em, campaignId, 'SENDING', 'FAILED', 'finished_at');
    deps.metrics?.campaignsFinished.inc({ status: 'failed' });
    deps.logger.warn({ campaignId, reason: refused }, 'campaign failed: its sender may not send');
    return 'failed-no-sender';
  }
  if (!(await saveTemplate(em, campaign))) return 'gone';
  const common = { from: formatFrom(sender), replyTo: campaign.reply_to ? JSON.stringify([campaign.reply_to]) : null };

  let cursor = campaign.fanout_cursor;
  // A page's sends go to Redis while the next page is written (enqueueCampaignSends never
  // throws); one enqueue at a time, in page order.
  let sends: Promise<void> = Promise.resolve();
  for (;;) {
    const page = await writePage(em, deps, campaign, common, cursor);
    if (page === null) {
      await sends;
      return 'gone'; // deleted (or no longer SENDING) meanwhile
    }
    if (page.last === null) break;
    cursor = page.last;
    deps.metrics?.campaignRecipientsQueued.inc(page.inserted.length);
    deps.metrics?.emailsAccepted.inc({ source: 'campaign' }, page.inserted.length);
    await sends;
    sends = enqueueCampaignSends(deps, page.inserted);
    if (page.read < deps.pageSize) break;
  }
  await sends;
  await markFanOutDone(em, campaignId);
  await enqueueCompletion(deps, campaignId);
  return 'done';
}

/**
 * The campaign's message, rendered once with its placeholders left in (content.ts), kept
 * for the send path. A resumed fan-out finds it written. False when the campaign is gone.
 */
async function saveTemplate(em: EntityManager, campaign: CampaignRow): Promise<boolean> {
  if (await templateExists(em, campaign.id)) return true;
  const template = renderCampaignTemplate({
    contentType: campaign.content_type,
    content: campaign.content,
    subject: campaign.subject,
    preview: campaign.preview,
  });
  return em.transactional(async (tx) => {
    if (!(await lockSendingCampaign(tx, campaign.id))) return false;
    await insertTemplate(tx as EntityManager, campaign.id, template);
    return true;
  });
}

/**
 * One page, ONE statement (atomic on its own): lock the campaign row if it is SENDING (a
 * concurrent delete waits for this page, or this page finds the campaign gone and writes
 * nothing), read the next page of recipients after `cursor`, insert their rows, and move
 * the cursor to the page's last subscriber id. The email ids are made here (sortable, like
 * every id) and matched to the page's rows by position. Null when the campaign is gone or
 * not SENDING. A tag renamed since the campaign was read renamed it in its filters too (in
 * the rename's transaction): the page is then written again with the filters as they are
 * now, so that a filter keeps meaning the same contacts (docs/campaigns.md).
 */
async function writePage(
  em: EntityManager,
  deps: FanOutDeps,
  campaign: CampaignRow,
  common: { from: string; replyTo: string | null },
  cursor: string | null,
): Promise<{ last: string | null; read: number; inserted: string[] } | null> {
  const ids = Array.from({ length: deps.pageSize }, () => newId('eml'));
  for (let attempt = 1; ; attempt++) {
    const page = await writeFanOutPage(em, {
      campaignId: campaign.id,
      organizationId: campaign.organization_id,
      filters: campaign.recipient_filters,
      cursor,
      pageSize: deps.pageSize,
      from: common.from,
      replyTo: common.replyTo,
      subject: campaign.subject,
      ids,
    });
    if (page.live > 0) return page;
    const now = await loadCampaign(em, campaign.id);
    if (!now || now.status !== 'SENDING') return null;
    // Renamed again meanwhile, page after page: the job fails and is retried (it resumes).
    if (attempt === 5) throw new Error(`campaign ${campaign.id}: its filters keep changing under the fan-out`);
    campaign.recipient_filters = now.recipient_filters;
  }
}

/**
 * One `send-batch` job per 1,000 emails; the send workers expand it into per-email `send`
 * jobs (at the tail of the queue). It goes to the HEAD of the queue (lifo), so that it is
 * expanded at once even behind a backlog of campaign mail: otherwise its rows could wait
 * long enough without a job of their own for the emails reconciler to enqueue them itself.
 * Never throws: the rows are committed, and the reconciler enqueues what a failure left out.
 */
async function enqueueCampaignSends(deps: FanOutDeps, ids: string[]): Promise<void> {
  for (let i = 0; i < ids.length; i += SEND_BATCH) {
    const emailIds = ids.slice(i, i + SEND_BATCH);
    try {
      await deps.producer.add('campaign-emails', { name: 'send-batch', data: { emailIds }, jobId: `batch-${emailIds[0]}`, opts: { ...SEND_JOB_OPTIONS, lifo: true } });
    } catch (error) {
      deps.logger.warn({ err: error, count: emailIds.length }, 'enqueue after commit failed; the reconciler will enqueue these emails');
    }
  }
}

const REQUEUE_PAGE = 1_000;

async function requeueQueued(em: EntityManager, deps: FanOutDeps, campaignId: string): Promise<void> {
  let after = '';
  for (;;) {
    const rows = await selectQueuedCampaignEmails(em, campaignId, after, REQUEUE_PAGE);
    if (rows.length === 0) return;
    // One job per email (not batches): a batch's jobId is its first email id, and a resumed
    // run's pages of queued rows need not match the first run's batches.
    await enqueueEmailSends(deps.producer, rows.map((r) => ({ id: r.id, source: 'campaign' as const })), deps.logger);
    after = rows[rows.length - 1]!.id;
  }
}

export async function enqueueCompletion(deps: { producer: QueueProducer; logger: Logger }, campaignId: string, delay = 500): Promise<void> {
  try {
    await deps.producer.add('campaigns', { name: 'complete', data: { campaignId }, jobId: `complete-${campaignId}`, opts: { ...CAMPAIGN_JOB_OPTIONS, delay } });
  } catch (error) {
    deps.logger.warn({ err: error, campaignId }, 'completion check not enqueued; the reconciler will enqueue it');
  }
}

/**
 * SENDING -> SENT once the fan-out is done and no email of the campaign is queued or being
 * handed over; FAILED when none was sent. Returns 'pending' while emails are still waiting.
 */
export async function completeCampaign(em: EntityManager, metrics: Metrics | undefined, campaignId: string): Promise<'pending' | 'gone' | CampaignStatus> {
  const campaign = await loadCampaign(em, campaignId);
  if (!campaign || campaign.status !== 'SENDING' || !campaign.fanout_done) return 'gone';
  if (await hasPendingEmails(em, campaignId)) return 'pending';
  const counts = await countCampaignEmails(em, campaignId);
  const to: CampaignStatus = counts.total > 0 && counts.sent === 0 ? 'FAILED' : 'SENT';
  const moved = await em.transactional(async (tx) => {
    const changed = await setStatus(tx as EntityManager, campaignId, 'SENDING', to, 'finished_at');
    if (changed && to === 'SENT') await recordCampaignSent(tx, campaignId);
    return changed;
  });
  if (moved) metrics?.campaignsFinished.inc({ status: to.toLowerCase() });
  return to;
}

/** Reconciler: SCHEDULED/SENDING campaigns whose job Redis lost (raw rows: timestamps may come back as text). */
export async function activeCampaigns(em: EntityManager): Promise<{ id: string; status: CampaignStatus; scheduled_at: Date | string | null; fanout_done: boolean }[]> {
  return selectActiveCampaigns(em);
}

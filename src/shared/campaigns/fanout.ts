import type { EntityManager, Knex } from '@mikro-orm/postgresql';
import type { Campaign, CampaignStatus, RecipientFilter } from '../db/entities/campaign.js';
import type { LinkSigner } from '../crypto.js';
import { enqueueEmailSends } from '../emails/service.js';
import { newId } from '../ids.js';
import type { Logger } from '../logger.js';
import type { Metrics } from '../metrics.js';
import type { QueueProducer } from '../queues/producer.js';
import { renderCampaignTemplate } from './content.js';
import { recipientsPage, type RecipientRow } from './filters.js';
import { fillHtml, fillSubject, fillText, unsubscribeToken, unsubscribeUrl, variablesOf } from './personalize.js';
import { CAMPAIGN_JOB_OPTIONS, formatFrom } from './service.js';
import { assertTransition } from './state.js';

/**
 * The fan-out of a campaign (contract 8), resumable (STYLE 10): recipients are read by
 * keyset pages of subscriber id; each page's email rows and the campaign's cursor (the last
 * subscriber id of the page) commit in ONE transaction, so a worker killed anywhere resumes
 * after the last committed page. Rows are inserted with `on conflict do nothing` on the
 * unique (campaign_id, subscriber_id): nobody gets two. Send jobs go to `campaign-emails`
 * after each commit; on resume, the queued rows of the campaign are enqueued again (the
 * jobId is the email id, so a job that still exists is not duplicated).
 */
export interface FanOutDeps {
  producer: QueueProducer;
  signer: LinkSigner;
  publicUrl: string;
  logger: Logger;
  metrics?: Metrics;
  pageSize: number;
  now: () => Date;
}

interface CampaignRow {
  id: string;
  organization_id: string;
  status: CampaignStatus;
  subject: string;
  preview: string | null;
  content_type: Campaign['contentType'];
  content: unknown;
  recipient_filters: RecipientFilter[];
  sender_id: string | null;
  reply_to: string | null;
  fanout_cursor: string | null;
  fanout_done: boolean;
}

const EMAIL_COLUMNS = `id, organization_id, source, campaign_id, subscriber_id, from_address, to_address, reply_to, subject, content_kind, content, text, tags, headers, created_at, updated_at`;
const EMAIL_ROW = `(?, ?, 'campaign', ?, ?, ?, ?, ?::jsonb, ?, 'html', ?, ?, '[]'::jsonb, ?::jsonb, now(), now())`;

async function loadCampaign(em: EntityManager, id: string): Promise<CampaignRow | undefined> {
  const [row] = await em.execute<CampaignRow[]>(
    `select id, organization_id, status, subject, preview, content_type, content, recipient_filters, sender_id, reply_to, fanout_cursor, fanout_done
     from campaigns where id = ?`,
    [id],
    'all',
  );
  return row;
}

async function setStatus(em: EntityManager, id: string, from: CampaignStatus, to: CampaignStatus, extra = ''): Promise<boolean> {
  assertTransition(from, to);
  const rows = await em.execute<{ id: string }[]>(
    `update campaigns set status = ?, updated_at = now()${extra} where id = ? and status = ? returning id`,
    [to, id, from],
    'all',
  );
  return rows.length > 0;
}

export type FanOutResult = 'gone' | 'not-due' | 'done' | 'failed-no-sender';

export async function runFanOut(em: EntityManager, deps: FanOutDeps, campaignId: string): Promise<FanOutResult> {
  let campaign = await loadCampaign(em, campaignId);
  if (!campaign) return 'gone';
  if (campaign.status === 'SCHEDULED') {
    // SCHEDULED -> SENDING: sendAt is when the worker started it.
    if (!(await setStatus(em, campaignId, 'SCHEDULED', 'SENDING', ', send_at = now()'))) return 'gone';
    campaign = { ...campaign, status: 'SENDING' };
  } else if (campaign.status !== 'SENDING') {
    return 'not-due';
  }
  if (campaign.fanout_done) {
    await enqueueCompletion(deps, campaignId);
    return 'done';
  }
  if (campaign.fanout_cursor !== null) await requeueQueued(em, deps, campaignId);

  const [sender] = await em.execute<{ name: string; email: string }[]>(
    'select name, email from senders where id = ? and organization_id = ?',
    [campaign.sender_id ?? '', campaign.organization_id],
    'all',
  );
  if (!sender) {
    await setStatus(em, campaignId, 'SENDING', 'FAILED', ', finished_at = now()');
    deps.metrics?.campaignsFinished.inc({ status: 'failed' });
    deps.logger.warn({ campaignId }, 'campaign failed: its sender no longer exists');
    return 'failed-no-sender';
  }
  const from = formatFrom(sender);
  const template = renderCampaignTemplate({
    contentType: campaign.content_type,
    content: campaign.content,
    subject: campaign.subject,
    preview: campaign.preview,
  });
  const replyTo = campaign.reply_to ? JSON.stringify([campaign.reply_to]) : null;

  let cursor = campaign.fanout_cursor;
  for (;;) {
    const page = await recipientsPage(em, campaign.organization_id, campaign.recipient_filters, cursor, deps.pageSize);
    if (page.length === 0) break;
    const last = page[page.length - 1]!.id;
    const inserted = await writePage(em, deps, campaign, page, { from, replyTo, template }, last);
    if (inserted === null) return 'gone'; // deleted (or no longer SENDING) meanwhile
    cursor = last;
    deps.metrics?.campaignRecipientsQueued.inc(inserted.length);
    deps.metrics?.emailsAccepted.inc({ source: 'campaign' }, inserted.length);
    await enqueueEmailSends(deps.producer, inserted.map((id) => ({ id, source: 'campaign' as const })), deps.logger);
    em.clear();
    if (page.length < deps.pageSize) break;
  }
  await em.execute(`update campaigns set fanout_done = true, updated_at = now() where id = ? and status = 'SENDING'`, [campaignId], 'run');
  await enqueueCompletion(deps, campaignId);
  return 'done';
}

async function writePage(
  em: EntityManager,
  deps: FanOutDeps,
  campaign: CampaignRow,
  page: RecipientRow[],
  common: { from: string; replyTo: string | null; template: { subject: string; html: string; text: string } },
  last: string,
): Promise<string[] | null> {
  const params: unknown[] = [];
  for (const r of page) {
    const url = unsubscribeUrl(deps.publicUrl, unsubscribeToken(deps.signer, r.id));
    const lookup = variablesOf(r, url);
    params.push(
      newId('eml'),
      campaign.organization_id,
      campaign.id,
      r.id,
      common.from,
      r.email,
      common.replyTo,
      fillSubject(common.template.subject, lookup),
      fillHtml(common.template.html, lookup),
      fillText(common.template.text, lookup),
      // RFC 8058 one-click: a POST to this URL with List-Unsubscribe=One-Click unsubscribes.
      JSON.stringify({ 'List-Unsubscribe': `<${url}>`, 'List-Unsubscribe-Post': 'List-Unsubscribe=One-Click' }),
    );
  }
  return em.transactional(async (tx) => {
    // The cursor first: it locks the row (a concurrent delete waits, or we see it gone).
    const moved = await tx.execute<{ id: string }[]>(
      `update campaigns set fanout_cursor = ?, updated_at = now() where id = ? and status = 'SENDING' returning id`,
      [last, campaign.id],
      'all',
    );
    if (moved.length === 0) return null;
    // Bound parameters through knex: MikroORM's execute() would inline ~2 MB of values into
    // the SQL text of each page (slow to build and to parse, and a burst of garbage).
    const trx = tx.getTransactionContext<Knex.Transaction>()!;
    const result = (await trx.raw(
      `insert into emails (${EMAIL_COLUMNS}) values ${page.map(() => EMAIL_ROW).join(', ')}
       on conflict (campaign_id, subscriber_id) where source = 'campaign' do nothing returning id`,
      params as never[],
    )) as { rows: { id: string }[] };
    return result.rows.map((r) => r.id);
  });
}

const REQUEUE_PAGE = 1_000;

async function requeueQueued(em: EntityManager, deps: FanOutDeps, campaignId: string): Promise<void> {
  let after = '';
  for (;;) {
    const rows = await em.execute<{ id: string }[]>(
      `select id from emails where campaign_id = ? and source = 'campaign' and status = 'queued' and id > ? order by id limit ?`,
      [campaignId, after, REQUEUE_PAGE],
      'all',
    );
    if (rows.length === 0) return;
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
  const [pending] = await em.execute<{ n: number }[]>(
    `select count(*)::int as n from (select 1 from emails where campaign_id = ? and source = 'campaign' and status in ('queued', 'sending') limit 1) p`,
    [campaignId],
    'all',
  );
  if ((pending?.n ?? 0) > 0) return 'pending';
  const [counts] = await em.execute<{ total: number; sent: number }[]>(
    `select count(*)::int as total, count(*) filter (where status = 'sent')::int as sent from emails where campaign_id = ? and source = 'campaign'`,
    [campaignId],
    'all',
  );
  const to: CampaignStatus = (counts?.total ?? 0) > 0 && (counts?.sent ?? 0) === 0 ? 'FAILED' : 'SENT';
  if (await setStatus(em, campaignId, 'SENDING', to, ', finished_at = now()')) metrics?.campaignsFinished.inc({ status: to.toLowerCase() });
  return to;
}

/** Reconciler: SCHEDULED/SENDING campaigns whose job Redis lost (raw rows: timestamps may come back as text). */
export async function activeCampaigns(em: EntityManager): Promise<{ id: string; status: CampaignStatus; scheduled_at: Date | string | null; fanout_done: boolean }[]> {
  return em.execute(`select id, status, scheduled_at, fanout_done from campaigns where status in ('SCHEDULED', 'SENDING') order by id`, [], 'all');
}

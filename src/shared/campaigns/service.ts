import type { Services } from '../container.js';
import { LockMode, type EntityManager } from '@mikro-orm/postgresql';
import { IANAZone, DateTime } from 'luxon';
import { Campaign, type CampaignContentType, type CampaignStatus, type RecipientFilter } from '../db/entities/campaign.js';
import { Sender } from '../db/entities/sender.js';
import { pageByIdCursor } from '../db/cursor.js';
import { createEmails } from '../emails/service.js';
import { NotFoundError, ValidationError } from '../errors.js';
import { isId, newId } from '../ids.js';
import type { Logger } from '../logger.js';
import type { Metrics } from '../metrics.js';
import type { QueueProducer } from '../queues/producer.js';
import type { Redis } from 'ioredis';
import type { Config } from '../config.js';
import { assertSendingAllowed, takeTestSend, type PolicyConfig } from '../domains/sending-policy.js';
import type { RenderPool } from '../emails/render-pool.js';
import { normalizeContent } from './content.js';
import { ContentTooDeepError } from '../emails/render.js';
import { countRecipients, deleteCampaignRows, scheduleDraft } from './queries.js';
import { fillHtml, fillSubject, fillText, TEST_UNSUBSCRIBE_TOKEN, unsubscribeHeaders, unsubscribeUrl, variablesOf } from './personalize.js';
import { assertTransition } from './state.js';

export const DEFAULT_TIMEZONE = 'Europe/Paris';
// The IANA zone names this runtime knows, by their lower-cased form (a constant of the runtime).
const ZONE_NAMES = new Map(['UTC', ...Intl.supportedValuesOf('timeZone')].map((zone) => [zone.toLowerCase(), zone]));
export const CAMPAIGN_JOB_OPTIONS = { removeOnComplete: true, removeOnFail: true } as const;

export interface CampaignFields {
  name?: string;
  subject?: string;
  preview?: string | null;
  content?: unknown;
  contentType?: CampaignContentType;
  mailFormat?: string | null;
  senderId?: string | null;
  replyTo?: string | null;
  recipientFilters?: RecipientFilter[];
}

export interface CampaignView {
  campaign: Campaign;
  sender: Sender | null;
  recipientCount: number;
}

async function findCampaign(em: EntityManager, organizationId: string, id: string, options: { lock?: boolean } = {}): Promise<Campaign> {
  // Locked (in the caller's transaction) and read afresh: a change of a DRAFT and its send check
  // and write the row one after the other, so neither acts on what the other replaced.
  const campaign = isId(id, 'cmp')
    ? await em.findOne(Campaign, { id, organizationId }, options.lock ? { lockMode: LockMode.PESSIMISTIC_WRITE, refresh: true } : {})
    : null;
  if (!campaign) throw new NotFoundError(`No campaign ${id}`);
  return campaign;
}

async function senderOf(em: EntityManager, organizationId: string, senderId: string | null): Promise<Sender | null> {
  if (!senderId || !isId(senderId, 'snd')) return null;
  return em.findOne(Sender, { id: senderId, organizationId });
}

/** The sender `senderId` names in the organization (null when none is named); a validation error when it names none there. */
async function checkSender(em: EntityManager, organizationId: string, senderId: string | null | undefined, status: 400 | 422 = 422): Promise<Sender | null> {
  if (senderId === undefined || senderId === null) return null;
  const sender = await senderOf(em, organizationId, senderId);
  if (!sender) throw new ValidationError(`senderId: no sender ${senderId} in this organization`, [{ path: 'senderId', message: 'unknown sender' }], status);
  return sender;
}

function contentOrThrow(contentType: CampaignContentType, content: unknown): unknown {
  const result = normalizeContent(contentType, content);
  if ('problem' in result) throw new ValidationError(`content: ${result.problem}`, [{ path: 'content', message: result.problem }]);
  return result.value;
}

/** The get shape's data: recipientCount live for drafts, frozen once scheduled. */
export async function viewOf(em: EntityManager, campaign: Campaign): Promise<CampaignView> {
  const sender = await senderOf(em, campaign.organizationId, campaign.senderId);
  const recipientCount =
    campaign.status === 'DRAFT' || campaign.recipientCount === null
      ? await countRecipients(em, campaign.organizationId, campaign.recipientFilters)
      : campaign.recipientCount;
  return { campaign, sender, recipientCount };
}

export async function createCampaign(em: EntityManager, organizationId: string, input: CampaignFields & { name: string }, now: Date): Promise<CampaignView> {
  const contentType = input.contentType ?? 'MARKDOWN';
  const content = contentOrThrow(contentType, input.content);
  await checkSender(em, organizationId, input.senderId);
  const campaign = em.create(Campaign, {
    id: newId('cmp'),
    organizationId,
    name: input.name,
    subject: input.subject ?? '',
    preview: input.preview ?? null,
    status: 'DRAFT',
    contentType,
    mailFormat: input.mailFormat ?? DEFAULT_MAIL_FORMAT,
    content,
    recipientFilters: input.recipientFilters ?? [],
    senderId: input.senderId ?? null,
    replyTo: input.replyTo ?? null,
    emailsSentCount: 0,
    emailsOpenedCount: 0,
    emailsClickedCount: 0,
    fanoutDone: false,
    createdAt: now,
    updatedAt: now,
  });
  await em.flush();
  return viewOf(em, campaign);
}

export async function getCampaign(em: EntityManager, organizationId: string, id: string): Promise<CampaignView> {
  return viewOf(em, await findCampaign(em, organizationId, id));
}

export async function listCampaigns(
  em: EntityManager,
  organizationId: string,
  query: { limit?: number; after?: string; before?: string; status?: CampaignStatus },
): Promise<{ items: CampaignView[]; hasMore: boolean }> {
  const page = await pageByIdCursor(
    em,
    Campaign,
    { scope: { organizationId }, ...(query.status ? { filters: { status: query.status } } : {}) },
    { ...query, limit: query.limit ?? 20 },
    'campaign',
  );
  return { items: await Promise.all(page.items.map((c) => viewOf(em, c))), hasMore: page.hasMore };
}

/** docs/campaigns.md "API decisions": `mailFormat` is a string; campaigns render to HTML (with a text part). */
export const DEFAULT_MAIL_FORMAT = 'html';

const PATCHABLE = ['subject', 'name', 'preview', 'content', 'contentType', 'mailFormat', 'senderId', 'replyTo', 'recipientFilters'] as const;

/** docs/campaigns.md "API decisions": only a DRAFT; `updatedFields` lists what changed, `warnings` what was ignored or remapped. */
export async function patchCampaign(
  em: EntityManager,
  organizationId: string,
  id: string,
  input: CampaignFields,
  ignored: string[],
): Promise<{ campaign: Campaign; updatedFields: string[]; warnings: string[] }> {
  return em.transactional((tx) => patchLockedCampaign(tx, organizationId, id, input, ignored));
}

async function patchLockedCampaign(em: EntityManager, organizationId: string, id: string, input: CampaignFields, ignored: string[]) {
  const campaign = await findCampaign(em, organizationId, id, { lock: true });
  if (campaign.status !== 'DRAFT') {
    throw new ValidationError(`The campaign is ${campaign.status}; only a DRAFT can be changed`, [{ path: 'status', message: `is ${campaign.status}` }]);
  }
  const warnings = ignored.map((f) =>
    f === 'scheduledAt' || f === 'timezone' || f === 'status'
      ? `${f} was ignored: schedule with POST /api/v2/campaigns/${id}/send`
      : `${f} was ignored: not a field of a campaign`,
  );
  const contentType = input.contentType ?? campaign.contentType;
  let content: unknown = campaign.content;
  if (input.content !== undefined) {
    content = contentOrThrow(contentType, input.content);
    if (typeof input.content === 'string' && contentType !== 'MARKDOWN') warnings.push('content was given as a JSON string; it is stored as the parsed document');
  } else if (input.contentType !== undefined && input.contentType !== campaign.contentType && campaign.content !== null) {
    const result = normalizeContent(contentType, campaign.content);
    if ('problem' in result) {
      throw new ValidationError(`contentType: the current content is not valid ${contentType} (${result.problem}); send content too`, [
        { path: 'contentType', message: `current content is not valid ${contentType}` },
      ]);
    }
  }
  await checkSender(em, organizationId, input.senderId);
  // A null mailFormat is the default, as at creation: stored and compared as such, so that
  // `updatedFields` never lists a field whose value reads the same.
  const mailFormat = input.mailFormat === null ? DEFAULT_MAIL_FORMAT : input.mailFormat;
  const next: Record<string, unknown> = { ...input, content, contentType, mailFormat };
  const updatedFields: string[] = [];
  for (const field of PATCHABLE) {
    if ((input as Record<string, unknown>)[field] === undefined) continue;
    const value = next[field];
    if (JSON.stringify((campaign as unknown as Record<string, unknown>)[field] ?? null) !== JSON.stringify(value ?? null)) {
      (campaign as unknown as Record<string, unknown>)[field] = value ?? null;
      updatedFields.push(field);
    }
  }
  if (updatedFields.length > 0) await em.flush();
  return { campaign, updatedFields, warnings };
}

/** docs/campaigns.md "API decisions": a SCHEDULED campaign's send is cancelled; a SENDING one stops. */
export async function deleteCampaign(em: EntityManager, deps: { producer: QueueProducer; logger?: Logger }, organizationId: string, id: string): Promise<{ status: CampaignStatus }> {
  // The row is locked: after the delete no further fan-out page is written, and emails still
  // queued are failed and never handed over.
  const status = await em.transactional((tx) => deleteCampaignRows(tx, organizationId, id));
  if (!status) throw new NotFoundError(`No campaign ${id}`);
  if (status === 'SCHEDULED' || status === 'SENDING') {
    try {
      // A waiting or delayed job goes; an active one finds the row gone at its next page.
      await deps.producer.queue('campaigns').remove(id);
    } catch (error) {
      deps.logger?.debug({ err: error, campaignId: id }, 'campaign job not removed (active); it stops by itself');
    }
  }
  return { status };
}

const ISO_LOCAL = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?$/;
const ISO_OFFSET = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-](\d{2}):?(\d{2}))$/i;

/** docs/campaigns.md "API decisions": with an offset the time is absolute; without one it is wall-clock in `timezone`. */
export function parseScheduledAt(value: string, timezone: string): Date {
  const bad = (message: string) => new ValidationError(`scheduledAt: ${message}`, [{ path: 'scheduledAt', message }], 400);
  let parsed: DateTime;
  const offset = ISO_OFFSET.exec(value);
  if (offset) {
    // RFC 3339's bounds: luxon takes `+99:99` as 4 days and 3 hours, moving the send silently.
    if (offset[4] !== undefined && (Number(offset[4]) > 23 || Number(offset[5]) > 59)) throw bad('has a UTC offset out of range (hours 00 to 23, minutes 00 to 59)');
    parsed = DateTime.fromISO(value, { setZone: true });
  } else if (ISO_LOCAL.test(value)) parsed = DateTime.fromISO(value, { zone: timezone });
  else throw bad('must be an ISO 8601 date and time, e.g. 2026-12-01T09:00:00Z or 2026-12-01T09:00 (wall clock in timezone)');
  if (!parsed.isValid) throw bad(`is not a valid date and time (${parsed.invalidExplanation ?? parsed.invalidReason})`);
  return parsed.toJSDate();
}

/** `null` is the same as absent (now; Europe/Paris). */
export interface ScheduleInput {
  scheduledAt?: string | null | undefined;
  timezone?: string | null | undefined;
}

export interface Scheduled {
  campaign: Campaign;
  timezoneGiven: boolean;
}

/** docs/campaigns.md "API decisions": DRAFT -> SCHEDULED with recipientCount frozen; the delayed job is enqueued after commit. */
export async function scheduleCampaign(
  em: EntityManager,
  deps: { producer: QueueProducer; logger?: Logger; config: PolicyConfig; render: Pick<RenderPool, 'unsubscribeLink'> },
  organizationId: string,
  id: string,
  input: ScheduleInput,
  now: Date,
): Promise<Scheduled> {
  const scheduled = await em.transactional((tx) => scheduleLockedCampaign(tx, deps, organizationId, id, input, now));
  await enqueueFanOut(deps, scheduled.campaign.id, scheduled.campaign.scheduledAt!, now);
  return scheduled;
}

/** The checks of a send and the DRAFT's move to SCHEDULED, under the campaign's row lock (the caller's transaction). */
async function scheduleLockedCampaign(
  em: EntityManager,
  deps: { config: PolicyConfig; render: Pick<RenderPool, 'unsubscribeLink'> },
  organizationId: string,
  id: string,
  input: ScheduleInput,
  now: Date,
): Promise<Scheduled> {
  const campaign = await findCampaign(em, organizationId, id, { lock: true });
  const v400 = (path: string, message: string) => new ValidationError(`${path}: ${message}`, [{ path, message }], 400);
  if (campaign.status !== 'DRAFT') throw v400('status', `the campaign is ${campaign.status}; only a DRAFT can be sent`);
  const given = input.timezone ?? DEFAULT_TIMEZONE;
  if (!IANAZone.isValidZone(given)) throw v400('timezone', `"${given}" is not an IANA time zone (e.g. Europe/Paris)`);
  // Stored and answered in IANA's case (`europe/paris` is Europe/Paris), the name itself as
  // given: ICU's own name may be a legacy alias (Asia/Kolkata resolves to Asia/Calcutta).
  const resolved = new Intl.DateTimeFormat('en-US', { timeZone: given }).resolvedOptions().timeZone;
  const timezone = ZONE_NAMES.get(given.toLowerCase()) ?? (resolved.toLowerCase() === given.toLowerCase() ? resolved : given);
  const scheduledAt = input.scheduledAt == null ? now : parseScheduledAt(input.scheduledAt, timezone);
  if (scheduledAt.getTime() < now.getTime()) throw v400('scheduledAt', 'is in the past');
  if (!campaign.senderId) throw v400('senderId', 'the campaign has no sender; set senderId first');
  const sender = (await checkSender(em, organizationId, campaign.senderId, 400))!;
  // docs/security.md "The sending policy": a From it refuses is 422 on every path (the spec's 400s of a send are
  // the campaign's own: status, time, unsubscribe link).
  await assertSendingAllowed(em, deps.config, organizationId, sender.email, 'senderId', 422);
  if (!campaign.subject.trim()) throw v400('subject', 'the campaign has no subject');
  let linked: boolean;
  try {
    // Markdown rendered and HTML parsed in a render thread: up to 1 MiB of content, never on
    // the API's event loop (every other request would wait for it).
    linked = await deps.render.unsubscribeLink(campaign.contentType, campaign.content);
  } catch (error) {
    if (error instanceof ContentTooDeepError) throw v400('content', error.message.replace(/^content /, ''));
    throw error;
  }
  if (!linked) {
    throw v400('content', 'the content has no unsubscribe link: add a link whose target is {{unsubscribe_url}}');
  }
  assertTransition(campaign.status, 'SCHEDULED', 400);
  const recipientCount = await countRecipients(em, organizationId, campaign.recipientFilters);
  if (!(await scheduleDraft(em, id, { scheduledAt, timezone, recipientCount }))) throw v400('status', 'the campaign is no longer a DRAFT');
  // The entity as scheduleDraft left the row: nothing is left to write, in this transaction or later.
  await em.refresh(campaign);
  return { campaign, timezoneGiven: input.timezone != null };
}

/** The delayed fan-out job (jobId = campaign id). Never throws: the reconciler re-adds a lost job. */
export async function enqueueFanOut(deps: { producer: QueueProducer; logger?: Logger }, campaignId: string, at: Date, now: Date): Promise<void> {
  try {
    await deps.producer.add('campaigns', {
      name: 'fan-out',
      data: { campaignId },
      jobId: campaignId,
      opts: { ...CAMPAIGN_JOB_OPTIONS, delay: Math.max(0, at.getTime() - now.getTime()), attempts: 20, backoff: { type: 'exponential', delay: 2_000 } },
    });
  } catch (error) {
    deps.logger?.warn({ err: error, campaignId }, 'campaign job not enqueued; the reconciler will enqueue it');
  }
}

export function formatFrom(sender: { name: string; email: string }): string {
  const name = sender.name.replace(/["\\\r\n]/g, '').trim();
  return name ? `"${name}" <${sender.email}>` : sender.email;
}

/** docs/campaigns.md "Personalisation and unsubscribe": one test email (source `test`), personalised for the test address. */
export async function sendTestEmail(
  em: EntityManager,
  deps: { producer: QueueProducer; logger?: Logger; publicUrl: string; metrics?: Metrics; render: RenderPool; config: Config; redis: Redis },
  organizationId: string,
  id: string,
  to: string,
  now: Date,
): Promise<{ id: string }> {
  const campaign = await findCampaign(em, organizationId, id);
  const sender = await senderOf(em, organizationId, campaign.senderId);
  if (!sender) throw new ValidationError('senderId: the campaign has no sender; set senderId first', [{ path: 'senderId', message: 'no sender' }]);
  await assertSendingAllowed(em, deps.config, organizationId, sender.email, 'senderId');
  // Counted once the request is valid, before anything is rendered or written.
  await takeTestSend(deps.redis, deps.config, organizationId, now);
  // A test goes to an address that is not a subscriber: its unsubscribe link and headers (as
  // every campaign email has them, docs/campaigns.md) lead to a page saying that it was a test send.
  const testUnsubscribe = unsubscribeUrl(deps.publicUrl, TEST_UNSUBSCRIBE_TOKEN);
  const lookup = variablesOf({ id: '', email: to, name: null, fields: {} }, testUnsubscribe);
  // Test sends are rare and interactive: rendered now (in a render thread, never on the
  // API's event loop), the emails pipeline sends the HTML.
  const template = await deps.render.campaign(campaign);
  const { ids } = await createEmails(em, deps, [
    {
      organizationId,
      source: 'test',
      campaignId: campaign.id,
      from: formatFrom(sender),
      to,
      subject: fillSubject(campaign.subject || campaign.name, lookup),
      contentKind: 'html',
      content: fillHtml(template.html, lookup),
      text: fillText(template.text, lookup),
      replyTo: campaign.replyTo ? [campaign.replyTo] : null,
      headers: unsubscribeHeaders(testUnsubscribe),
    },
  ]);
  deps.metrics?.emailsAccepted.inc({ source: 'test' });
  return { id: ids[0]! };
}

/** What the campaign commands need of a process's services: the API routes and the dashboard pass the same. */
export function campaignDeps(services: Pick<Services, 'producer' | 'logger' | 'config' | 'metrics' | 'render' | 'redis'>) {
  const { producer, logger, config, metrics, render, redis } = services;
  return { producer, logger, publicUrl: config.publicUrl, metrics, render, config, redis };
}

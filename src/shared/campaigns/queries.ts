import type { EntityManager } from '@mikro-orm/postgresql';
import { sqlOf } from '../db/sql.js';
import type { Campaign, CampaignStatus, RecipientFilter } from '../db/entities/campaign.js';

/**
 * The data access of campaigns: every statement on `campaigns` and `campaign_templates`,
 * the recipients' selection (filters) and the fan-out's page (the one statement that
 * writes a page of campaign emails). Campaigns are otherwise read and written through the
 * ORM entity (service.ts).
 */

type Execute = Pick<EntityManager, 'execute'>;

// ---------------------------------------------------------------- recipients

/** The WHERE clause (on alias `s`) and its parameters. */
function recipientWhere(organizationId: string, filters: readonly RecipientFilter[]): { sql: string; params: unknown[] } {
  const clauses = [`s.organization_id = ?`, `s.status = 'SUBSCRIBED'`];
  const params: unknown[] = [organizationId];
  for (const f of filters) {
    if (f.type === 'tag') {
      const exists = `exists (select 1 from subscriber_tags st join tags t on t.id = st.tag_id
        where st.subscriber_id = s.id and t.organization_id = s.organization_id and lower(t.name) = lower(?))`;
      clauses.push(f.op === 'has' ? exists : `not ${exists}`);
      params.push(f.value);
    } else if (f.op === 'eq') {
      clauses.push(`s.fields ->> ? = ?`);
      params.push(f.name, f.value);
    } else if (f.op === 'neq') {
      clauses.push(`(s.fields ->> ?) is distinct from ?`);
      params.push(f.name, f.value);
    } else {
      clauses.push(`s.fields ->> ? is ${f.op === 'exists' ? 'not ' : ''}null`);
      params.push(f.name);
    }
  }
  return { sql: clauses.join(' and '), params };
}

/**
 * A tag renamed: the campaigns' tag filters naming it (they name tags, case aside) name it
 * by its new name, so a filter keeps meaning the same contacts. Returns how many campaigns.
 */
export async function renameTagInFilters(em: Execute, organizationId: string, from: string, to: string): Promise<number> {
  const updated = await em.execute<{ id: string }[]>(
    `update campaigns c set recipient_filters = (
       select jsonb_agg(case when f ->> 'type' = 'tag' and lower(f ->> 'value') = lower(?) then jsonb_set(f, '{value}', to_jsonb(?::text)) else f end order by n)
         from jsonb_array_elements(c.recipient_filters) with ordinality as t(f, n))
     where c.organization_id = ?
       and exists (select 1 from jsonb_array_elements(c.recipient_filters) f where f ->> 'type' = 'tag' and lower(f ->> 'value') = lower(?))
     returning c.id`,
    [from, to, organizationId, from],
    'all',
  );
  return updated.length;
}

/** How many contacts match now: one SQL count. */
export async function countRecipients(em: Execute, organizationId: string, filters: readonly RecipientFilter[]): Promise<number> {
  const where = recipientWhere(organizationId, filters);
  const [row] = await em.execute<{ n: string }[]>(`select count(*) as n from subscribers s where ${where.sql}`, where.params, 'all');
  return Number(row?.n ?? 0);
}

// ---------------------------------------------------------------- campaigns

export interface CampaignRow {
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

export async function selectCampaign(em: Execute, id: string): Promise<CampaignRow | undefined> {
  const [row] = await em.execute<CampaignRow[]>(
    `select id, organization_id, status, subject, preview, content_type, content, recipient_filters, sender_id, reply_to, fanout_cursor, fanout_done
     from campaigns where id = ?`,
    [id],
    'all',
  );
  return row;
}

/**
 * `from` -> `to` when the campaign is still `from`; `stamp` is set to now() too. False when
 * it was not (moved or deleted meanwhile). The caller checks the transition (state.ts).
 */
export async function updateCampaignStatus(em: Execute, id: string, from: CampaignStatus, to: CampaignStatus, stamp?: 'send_at' | 'finished_at'): Promise<boolean> {
  const extra = stamp ? `, ${stamp} = now()` : '';
  const rows = await em.execute<{ id: string }[]>(
    `update campaigns set status = ?, updated_at = now()${extra} where id = ? and status = ? returning id`,
    [to, id, from],
    'all',
  );
  return rows.length > 0;
}

/** DRAFT -> SCHEDULED with its time and recipient count; false when no longer a DRAFT. */
export async function scheduleDraft(em: Execute, id: string, s: { scheduledAt: Date; timezone: string; recipientCount: number }): Promise<boolean> {
  const updated = await em.execute<{ id: string }[]>(
    `update campaigns set status = 'SCHEDULED', scheduled_at = ?, timezone = ?, recipient_count = ?, updated_at = now()
       where id = ? and status = 'DRAFT' returning id`,
    [s.scheduledAt, s.timezone, s.recipientCount, id],
    'all',
  );
  return updated.length > 0;
}

/**
 * The fan-out wrote every recipient: `recipient_count`, frozen at schedule time, becomes the
 * number of emails written (the audience as it was when the fan-out ran: subscribers who came
 * or left in between count as they were then), so that a sent campaign never reads more sent
 * than recipients.
 */
export async function markFanOutDone(em: Execute, campaignId: string): Promise<void> {
  await em.execute(
    `update campaigns set fanout_done = true, updated_at = now(),
       recipient_count = (select count(*) from emails where campaign_id = ? and source = 'campaign')
     where id = ? and status = 'SENDING'`,
    [campaignId, campaignId],
    'run',
  );
}

/** Reconciler: SCHEDULED/SENDING campaigns whose job Redis lost (raw rows: timestamps may come back as text). */
export async function selectActiveCampaigns(em: Execute): Promise<{ id: string; status: CampaignStatus; scheduled_at: Date | string | null; fanout_done: boolean }[]> {
  return em.execute(`select id, status, scheduled_at, fanout_done from campaigns where status in ('SCHEDULED', 'SENDING') order by id`, [], 'all');
}

/**
 * Deletes a campaign of the organization: locks its row (a fan-out page commits its cursor
 * under this lock, so no page is written after), fails its emails still queued, deletes it.
 * Run in a transaction. Answers the status it had, or nothing when there is no such campaign
 * (any more: a second delete at the same time waits for the first, then finds none).
 */
export async function deleteCampaignRows(tx: Execute, organizationId: string, id: string): Promise<CampaignStatus | undefined> {
  const [row] = await tx.execute<{ status: CampaignStatus }[]>(`select status from campaigns where id = ? and organization_id = ? for update`, [id, organizationId], 'all');
  if (!row) return undefined;
  await tx.execute(
    `update emails set status = 'failed', failure_reason = 'campaign deleted', updated_at = now()
       where campaign_id = ? and source = 'campaign' and status = 'queued'`,
    [id],
    'run',
  );
  await tx.execute(`delete from campaigns where id = ?`, [id], 'run');
  return row.status;
}

export async function selectSender(em: Execute, senderId: string, organizationId: string): Promise<{ name: string; email: string } | undefined> {
  const [sender] = await em.execute<{ name: string; email: string }[]>(
    'select name, email from senders where id = ? and organization_id = ?',
    [senderId, organizationId],
    'all',
  );
  return sender;
}

// ---------------------------------------------------------------- templates

export async function templateExists(em: Execute, campaignId: string): Promise<boolean> {
  const [found] = await em.execute<{ n: number }[]>(`select count(*)::int as n from campaign_templates where campaign_id = ?`, [campaignId], 'all');
  return (found?.n ?? 0) > 0;
}

/** Locks the campaign row while it is SENDING; false when it is not (or gone). In a transaction. */
export async function lockSendingCampaign(tx: Execute, campaignId: string): Promise<boolean> {
  const live = await tx.execute<{ id: string }[]>(`select id from campaigns where id = ? and status = 'SENDING' for update`, [campaignId], 'all');
  return live.length > 0;
}

/** Within `tx`'s transaction; a template already written stays. */
export async function insertTemplate(tx: EntityManager, campaignId: string, template: { subject: string; html: string; text: string }): Promise<void> {
  await sqlOf(tx).query(`insert into campaign_templates (campaign_id, subject, html, text) values (?, ?, ?, ?) on conflict (campaign_id) do nothing`, [
    campaignId,
    template.subject,
    template.html,
    template.text,
  ]);
}

// ---------------------------------------------------------------- fan-out

export interface FanOutPage {
  /** 0 when the campaign is gone or not SENDING (nothing was written). */
  live: number;
  /** The page's last subscriber id; null when no recipient is left. */
  last: string | null;
  read: number;
  /** Ids of the emails written (a recipient who already has one is skipped). */
  inserted: string[];
}

/**
 * One page, ONE statement (fanout.ts explains why): the next `pageSize` recipients after
 * `cursor`, their email rows (ids from `ids`, by position) and the campaign's cursor moved.
 * Nothing is written (`live` 0) unless the campaign is SENDING with exactly `filters`: a tag
 * renamed since they were read renamed it in the campaign's filters too.
 */
export async function writeFanOutPage(
  em: EntityManager,
  page: {
    campaignId: string;
    organizationId: string;
    filters: readonly RecipientFilter[];
    cursor: string | null;
    pageSize: number;
    from: string;
    replyTo: string | null;
    subject: string;
    ids: string[];
  },
): Promise<FanOutPage> {
  const where = recipientWhere(page.organizationId, page.filters);
  // Bound parameters (MikroORM's execute() would inline the ids into the SQL).
  const [result] = await sqlOf(em).query<FanOutPage>(
    `with live as (select id from campaigns where id = ? and status = 'SENDING' and recipient_filters = ?::jsonb for update),
     page as (
       select s.id, s.email, row_number() over (order by s.id) as n
       from (select s.id, s.email from subscribers s
             where exists (select 1 from live) and ${where.sql} and s.id > ? order by s.id limit ?) s
     ),
     inserted as (
       insert into emails (id, organization_id, source, campaign_id, subscriber_id, from_address, to_address, reply_to, subject, content_kind, content, created_at, updated_at)
       select i.id, ?, 'campaign', ?, p.id, ?, p.email, ?::jsonb, ?, 'campaign', '', now(), now()
       from page p join unnest(?::text[]) with ordinality as i(id, n) on i.n = p.n
       on conflict (campaign_id, subscriber_id) where source = 'campaign' do nothing
       returning id
     ),
     moved as (
       update campaigns set fanout_cursor = (select max(id) from page), updated_at = now()
       where id in (select id from live) and exists (select 1 from page)
     )
     select (select count(*)::int from live) as live, (select max(id) from page) as last, (select count(*)::int from page) as read,
            coalesce((select array_agg(id) from inserted), '{}') as inserted`,
    [
      page.campaignId,
      JSON.stringify(page.filters),
      ...where.params,
      page.cursor ?? '',
      page.pageSize,
      page.organizationId,
      page.campaignId,
      page.from,
      page.replyTo,
      page.subject,
      page.ids,
    ],
  );
  return result!;
}

/** A page of the campaign's emails still queued, after `after` by id. */
export async function selectQueuedCampaignEmails(em: Execute, campaignId: string, after: string, limit: number): Promise<{ id: string }[]> {
  return em.execute<{ id: string }[]>(
    `select id from emails where campaign_id = ? and source = 'campaign' and status = 'queued' and id > ? order by id limit ?`,
    [campaignId, after, limit],
    'all',
  );
}

/** Whether an email of the campaign is still queued or being handed over. */
export async function hasPendingEmails(em: Execute, campaignId: string): Promise<boolean> {
  const [pending] = await em.execute<{ n: number }[]>(
    `select count(*)::int as n from (select 1 from emails where campaign_id = ? and source = 'campaign' and status in ('queued', 'sending') limit 1) p`,
    [campaignId],
    'all',
  );
  return (pending?.n ?? 0) > 0;
}

export async function countCampaignEmails(em: Execute, campaignId: string): Promise<{ total: number; sent: number }> {
  const [counts] = await em.execute<{ total: number; sent: number }[]>(
    `select count(*)::int as total, count(*) filter (where status = 'sent')::int as sent from emails where campaign_id = ? and source = 'campaign'`,
    [campaignId],
    'all',
  );
  return { total: counts?.total ?? 0, sent: counts?.sent ?? 0 };
}

// ---------------------------------------------------------------- unsubscribe links

export async function selectUnsubscribeTarget(
  em: Execute,
  subscriberId: string,
): Promise<{ id: string; organization_id: string; email: string; status: string; org_name: string } | undefined> {
  const [row] = await em.execute<{ id: string; organization_id: string; email: string; status: string; org_name: string }[]>(
    `select s.id, s.organization_id, s.email, s.status, o.name as org_name from subscribers s join organizations o on o.id = s.organization_id where s.id = ?`,
    [subscriberId],
    'all',
  );
  return row;
}

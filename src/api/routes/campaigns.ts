import { z } from 'zod';
import { CAMPAIGN_STATUSES, CONTENT_TYPES } from '../../shared/db/entities/campaign.js';
import { RecipientFiltersSchema } from '../../shared/campaigns/filters.js';
import {
  DEFAULT_MAIL_FORMAT,
  campaignDeps,
  createCampaign,
  deleteCampaign,
  getCampaign,
  listCampaigns,
  patchCampaign,
  scheduleCampaign,
  sendTestEmail,
  type CampaignView,
} from '../../shared/campaigns/service.js';
import { iso, limitQuery, list, listEnvelope, Timestamp } from '../schemas.js';
import type { App } from '../types.js';

const noLineBreak = (v: string) => !/[\r\n]/.test(v);
const Subject = z.string().max(998, 'at most 998 characters').refine(noLineBreak, 'must not contain CR or LF');
const Name = z.string().trim().min(1, 'must be 1 to 100 characters').max(100, 'must be 1 to 100 characters');
const Content = z.unknown().describe('MARKDOWN: a string; MAILY/PLATE: the editor JSON, as an object or its JSON text');

const CampaignFieldsShape = {
  subject: Subject.optional(),
  preview: z.string().max(1000).refine(noLineBreak, 'must not contain CR or LF').nullable().optional(),
  content: Content.optional(),
  contentType: z.enum(CONTENT_TYPES).optional(),
  mailFormat: z.string().max(50).nullable().optional().describe('Free text, default "html"; null sets the default'),
  senderId: z.string().max(100).nullable().optional(),
  replyTo: z.email('must be an email address').nullable().optional(),
  recipientFilters: RecipientFiltersSchema.optional(),
};

export const CreateBody = z.strictObject({ name: Name, ...CampaignFieldsShape });
export const PatchBody = z.looseObject({ name: Name.optional(), ...CampaignFieldsShape });
const KNOWN = new Set(Object.keys(PatchBody.shape));

const CampaignOut = z.object({
  object: z.literal('campaign'),
  id: z.string(),
  name: z.string(),
  subject: z.string(),
  preview: z.string().nullable(),
  status: z.enum(CAMPAIGN_STATUSES),
  contentType: z.enum(CONTENT_TYPES),
  mailFormat: z.string(),
  content: z.unknown(),
  recipientCount: z.number().int(),
  recipientFilters: z.array(z.unknown()),
  emailsSentCount: z.number().int(),
  emailsOpenedCount: z.number().int(),
  emailsClickedCount: z.number().int(),
  scheduledAt: Timestamp.nullable(),
  sendAt: Timestamp.nullable(),
  timezone: z.string().nullable(),
  senderId: z.string().nullable(),
  sender: z.object({ id: z.string(), name: z.string(), email: z.string() }).nullable(),
  replyTo: z.string().nullable(),
  createdAt: Timestamp,
  updatedAt: Timestamp,
}).meta({ id: 'Campaign' });

function campaignOut({ campaign: c, sender, recipientCount }: CampaignView): z.infer<typeof CampaignOut> {
  return {
    object: 'campaign',
    id: c.id,
    name: c.name,
    subject: c.subject,
    preview: c.preview,
    status: c.status,
    contentType: c.contentType,
    // Always a string (docs/campaigns.md "API decisions"): null (an older row, or set to null)
    // reads as the default.
    mailFormat: c.mailFormat ?? DEFAULT_MAIL_FORMAT,
    content: c.content,
    recipientCount,
    recipientFilters: c.recipientFilters,
    emailsSentCount: c.emailsSentCount,
    emailsOpenedCount: c.emailsOpenedCount,
    emailsClickedCount: c.emailsClickedCount,
    scheduledAt: iso(c.scheduledAt),
    sendAt: iso(c.sendAt),
    timezone: c.timezone,
    senderId: c.senderId,
    sender: sender ? { id: sender.id, name: sender.name, email: sender.email } : null,
    replyTo: c.replyTo,
    createdAt: iso(c.createdAt),
    updatedAt: iso(c.updatedAt),
  };
}

const Params = z.object({ campaignId: z.string().max(100) });

/** docs/campaigns.md "API decisions"; also the `schedule_campaign` tool's arguments (src/api/tools/catalog.ts). */
/** `GET /campaigns`' query (the `list_campaigns` tool takes the same filters). */
export const ListCampaignsQuery = z.object({
  limit: limitQuery.optional(),
  after: z.string().max(100).optional().describe('A campaign id: the campaigns older than it'),
  before: z.string().max(100).optional().describe('A campaign id: the `limit` campaigns just newer than it, newest first'),
  status: z.enum(CAMPAIGN_STATUSES).optional(),
});

export const SendBody = z.strictObject({
  scheduledAt: z.string().max(100).nullish().describe('ISO 8601; without an offset, a wall-clock time in timezone; absent or null: now'),
  timezone: z.string().max(100).nullish().describe('IANA time zone, default Europe/Paris'),
});
const tags = ['campaigns'];

export async function campaignsRoutes(app: App): Promise<void> {
  const deps = () => campaignDeps(app.services);

  app.post(
    '/campaigns',
    { config: { permission: 'campaigns' }, schema: { tags, summary: 'Create a campaign (DRAFT)', body: CreateBody, response: { 200: CampaignOut } } },
    async (request) => campaignOut(await createCampaign(request.em, request.caller.organizationId, request.body, app.services.clock())),
  );

  app.get(
    '/campaigns',
    {
      config: { permission: 'campaigns' },
      schema: {
        tags,
        summary: 'List campaigns, newest first',
        querystring: ListCampaignsQuery,
        response: { 200: listEnvelope(CampaignOut) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listCampaigns(request.em, request.caller.organizationId, request.query);
      return list(items.map(campaignOut), hasMore);
    },
  );

  app.get(
    '/campaigns/:campaignId',
    { config: { permission: 'campaigns' }, schema: { tags, summary: 'Get a campaign', params: Params, response: { 200: CampaignOut } } },
    async (request) => campaignOut(await getCampaign(request.em, request.caller.organizationId, request.params.campaignId)),
  );

  app.patch(
    '/campaigns/:campaignId',
    {
      config: { permission: 'campaigns' },
      schema: {
        tags,
        summary: 'Change a DRAFT campaign',
        params: Params,
        body: PatchBody,
        response: {
          200: CampaignOut.pick({
            id: true,
            name: true,
            subject: true,
            preview: true,
            status: true,
            contentType: true,
            senderId: true,
            replyTo: true,
          }).extend({
            updatedFields: z.array(z.string()),
            warnings: z.array(z.string()).optional(),
          }),
        },
      },
    },
    async (request) => {
      const body = request.body;
      const ignored = Object.keys(body).filter((k) => !KNOWN.has(k));
      const fields = Object.fromEntries(Object.entries(body).filter(([k]) => KNOWN.has(k))) as z.infer<typeof CreateBody>;
      const { campaign: c, updatedFields, warnings } = await patchCampaign(request.em, request.caller.organizationId, request.params.campaignId, fields, ignored);
      return {
        id: c.id,
        name: c.name,
        subject: c.subject,
        preview: c.preview,
        status: c.status,
        contentType: c.contentType,
        senderId: c.senderId,
        replyTo: c.replyTo,
        updatedFields,
        ...(warnings.length > 0 ? { warnings } : {}),
      };
    },
  );

  app.delete(
    '/campaigns/:campaignId',
    {
      config: { permission: 'campaigns' },
      schema: {
        tags,
        summary: 'Delete a campaign (cancels a scheduled send, stops a running one)',
        params: Params,
        response: { 200: z.object({ object: z.literal('campaign'), id: z.string(), deleted: z.literal(true) }) },
      },
    },
    async (request) => {
      const { status } = await deleteCampaign(request.em, deps(), request.caller.organizationId, request.params.campaignId);
      if (status === 'SCHEDULED' || status === 'SENDING') app.services.metrics.campaignsFinished.inc({ status: 'cancelled' });
      return { object: 'campaign' as const, id: request.params.campaignId, deleted: true as const };
    },
  );

  app.post(
    '/campaigns/:campaignId/send',
    {
      config: { permission: 'send', validationStatus: 400 },
      schema: {
        tags,
        summary: 'Send or schedule a campaign',
        params: Params,
        // No body at all is "send now" (docs/campaigns.md "API decisions": both fields optional).
        body: SendBody.nullish(),
        response: {
          200: z.object({
            id: z.string(),
            campaignId: z.string(),
            subject: z.string(),
            status: z.literal('SCHEDULED'),
            scheduledAt: Timestamp,
            timezone: z.string().optional(),
            recipientCount: z.number().int(),
          }),
        },
      },
    },
    async (request) => {
      const { campaign, timezoneGiven } = await scheduleCampaign(
        request.em,
        deps(),
        request.caller.organizationId,
        request.params.campaignId,
        request.body ?? {},
        app.services.clock(),
      );
      return {
        id: campaign.id,
        campaignId: campaign.id,
        subject: campaign.subject,
        status: 'SCHEDULED' as const,
        scheduledAt: iso(campaign.scheduledAt!),
        ...(timezoneGiven ? { timezone: campaign.timezone! } : {}),
        recipientCount: campaign.recipientCount ?? 0,
      };
    },
  );

  app.post(
    '/campaigns/:campaignId/test',
    {
      // A test send mails any address with the tenant's content: a send path (docs/security.md).
      config: { permission: 'send' },
      schema: {
        tags,
        summary: 'Send one test email of the campaign',
        params: Params,
        body: z.strictObject({ to: z.email('must be an email address') }),
        response: { 200: z.object({ id: z.string(), object: z.literal('email') }) },
      },
    },
    async (request) => {
      const { id } = await sendTestEmail(request.em, deps(), request.caller.organizationId, request.params.campaignId, request.body.to, app.services.clock());
      return { id, object: 'email' as const };
    },
  );
}

import { EntitySchema } from '@mikro-orm/core';

export const CAMPAIGN_STATUSES = ['DRAFT', 'ARCHIVED', 'SCHEDULED', 'SENDING', 'SENT', 'FAILED'] as const;
export type CampaignStatus = (typeof CAMPAIGN_STATUSES)[number];
export const CONTENT_TYPES = ['MARKDOWN', 'MAILY', 'PLATE'] as const;
export type CampaignContentType = (typeof CONTENT_TYPES)[number];

export type RecipientFilter =
  | { type: 'tag'; op: 'has' | 'not_has'; value: string }
  | { type: 'field'; name: string; op: 'eq' | 'neq' | 'exists' | 'not_exists'; value?: string };

/** A campaign (docs/campaigns.md "API decisions"); its status moves only through `campaigns/state.ts`. */
export class Campaign {
  id!: string;
  organizationId!: string;
  name!: string;
  subject = '';
  preview: string | null = null;
  status: CampaignStatus = 'DRAFT';
  contentType: CampaignContentType = 'MARKDOWN';
  mailFormat: string | null = null;
  /** MARKDOWN: a string; MAILY / PLATE: the editor's JSON document. */
  content: unknown = null;
  recipientFilters: RecipientFilter[] = [];
  /** Frozen when the campaign is scheduled; counted live for drafts. */
  recipientCount: number | null = null;
  emailsSentCount = 0;
  emailsOpenedCount = 0;
  emailsClickedCount = 0;
  scheduledAt: Date | null = null;
  sendAt: Date | null = null;
  timezone: string | null = null;
  senderId: string | null = null;
  replyTo: string | null = null;
  /** Fan-out: the last subscriber id whose email row is committed. */
  fanoutCursor: string | null = null;
  fanoutDone = false;
  finishedAt: Date | null = null;
  createdAt: Date = new Date();
  updatedAt: Date = new Date();
}

export const CampaignSchema = new EntitySchema<Campaign>({
  class: Campaign,
  tableName: 'campaigns',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    name: { type: 'text' },
    subject: { type: 'text' },
    preview: { type: 'text', nullable: true },
    status: { type: 'string' },
    contentType: { type: 'string' },
    mailFormat: { type: 'text', nullable: true },
    content: { type: 'json', nullable: true },
    recipientFilters: { type: 'json' },
    recipientCount: { type: 'integer', nullable: true },
    emailsSentCount: { type: 'integer' },
    emailsOpenedCount: { type: 'integer' },
    emailsClickedCount: { type: 'integer' },
    scheduledAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    sendAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    timezone: { type: 'text', nullable: true },
    senderId: { type: 'string', nullable: true },
    replyTo: { type: 'text', nullable: true },
    fanoutCursor: { type: 'string', nullable: true },
    fanoutDone: { type: 'boolean' },
    finishedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
    updatedAt: { type: 'Date', columnType: 'timestamptz(3)', onUpdate: () => new Date() },
  },
});

import { EntitySchema } from '@mikro-orm/core';

export type EmailSource = 'api' | 'campaign' | 'test';
/** Internal send status; `last_event` (docs/outcomes.md "`last_event`") is derived from it and the tracking columns. */
export type EmailStatus = 'queued' | 'sending' | 'sent' | 'failed';
export type DeliveryStatus = 'delivered' | 'bounced' | 'complained';
/**
 * `campaign`: a campaign email whose body is its campaign's template (`campaign_templates`),
 * personalised for the subscriber when the send path claims it; `content` is empty.
 * `message`: a message submitted over SMTP, sent as submitted: `content` is its HTML part
 * (empty when it has none), its headers, envelope and attachments are beside it
 * (src/shared/submission).
 */
export type ContentKind = 'html' | 'markdown' | 'tiptap' | 'campaign' | 'message';

export interface EmailTag {
  name: string;
  value: string;
}

/**
 * One message to one recipient, whatever its source (API send, campaign, test send).
 * Rows are inserted with multi-row SQL by the emails service (hot path) and read through
 * this entity.
 */
export class Email {
  id!: string;
  organizationId!: string;
  source: EmailSource = 'api';
  campaignId: string | null = null;
  subscriberId: string | null = null;
  status: EmailStatus = 'queued';
  deliveryStatus: DeliveryStatus | null = null;
  /** As given, display name included: `Name <addr>` or `addr`. */
  from!: string;
  to!: string;
  cc: string[] | null = null;
  bcc: string[] | null = null;
  replyTo: string[] | null = null;
  subject!: string;
  contentKind!: ContentKind;
  /** The original content: HTML or markdown text, or the tiptap document as JSON text. */
  content!: string;
  preview: string | null = null;
  /** Rendered HTML (without tracking), stored by the worker at send time. */
  html: string | null = null;
  /** Plain text: as given, or generated from the HTML at send time. */
  text: string | null = null;
  tags: EmailTag[] = [];
  /** Extra headers (e.g. List-Unsubscribe for campaign mail). */
  headers: Record<string, string> = {};
  /** Message-ID without angle brackets, set when the message is handed to the provider. */
  messageId: string | null = null;
  failureReason: string | null = null;
  attempts = 0;
  claimedAt: Date | null = null;
  sentAt: Date | null = null;
  firstOpenedAt: Date | null = null;
  firstClickedAt: Date | null = null;
  createdAt: Date = new Date();
  updatedAt: Date = new Date();
}

export const EmailSchema = new EntitySchema<Email>({
  class: Email,
  tableName: 'emails',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    source: { type: 'string' },
    campaignId: { type: 'string', nullable: true },
    subscriberId: { type: 'string', nullable: true },
    status: { type: 'string' },
    deliveryStatus: { type: 'string', nullable: true },
    from: { type: 'text', fieldName: 'from_address' },
    to: { type: 'text', fieldName: 'to_address' },
    cc: { type: 'json', nullable: true },
    bcc: { type: 'json', nullable: true },
    replyTo: { type: 'json', nullable: true },
    subject: { type: 'text' },
    contentKind: { type: 'string' },
    content: { type: 'text' },
    preview: { type: 'text', nullable: true },
    html: { type: 'text', nullable: true },
    text: { type: 'text', nullable: true },
    tags: { type: 'json' },
    headers: { type: 'json' },
    messageId: { type: 'string', nullable: true },
    failureReason: { type: 'text', nullable: true },
    attempts: { type: 'integer' },
    claimedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    sentAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    firstOpenedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    firstClickedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
    updatedAt: { type: 'Date', columnType: 'timestamptz(3)', onUpdate: () => new Date() },
  },
});

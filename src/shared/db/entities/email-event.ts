import { EntitySchema } from '@mikro-orm/core';

export type EmailEventType = 'open' | 'click' | 'delivered' | 'bounced' | 'complained';

/** One tracking hit or provider event of an email; written with SQL by src/shared/outcomes. */
export class EmailEvent {
  id!: string;
  emailId!: string;
  organizationId!: string;
  type!: EmailEventType;
  occurredAt: Date = new Date();
  ip: string | null = null;
  userAgent: string | null = null;
  url: string | null = null;
  details: Record<string, unknown> | null = null;
}

export const EmailEventSchema = new EntitySchema<EmailEvent>({
  class: EmailEvent,
  tableName: 'email_events',
  properties: {
    id: { type: 'bigint', primary: true },
    emailId: { type: 'string' },
    organizationId: { type: 'string' },
    type: { type: 'string' },
    occurredAt: { type: 'Date', columnType: 'timestamptz(3)' },
    ip: { type: 'text', nullable: true },
    userAgent: { type: 'text', nullable: true },
    url: { type: 'text', nullable: true },
    details: { type: 'json', nullable: true },
  },
});

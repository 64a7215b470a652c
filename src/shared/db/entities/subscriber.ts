import { BigIntType, EntitySchema } from '@mikro-orm/core';

export const SUBSCRIBER_STATUSES = [
  'PENDING_CONFIRMATION',
  'SUBSCRIBED',
  'UNSUBSCRIBED',
  'BOUNCED',
  'BANNED',
  'COMPLAINED',
  'TRANSACTIONAL',
] as const;
export type SubscriberStatus = (typeof SUBSCRIBER_STATUSES)[number];

/**
 * A contact of an organization. The audience module writes these rows with SQL
 * (`insert ... on conflict`, see src/shared/subscribers); the entity is for readers such as
 * campaigns. `fields` is a jsonb map of custom field name to string value.
 */
export class Subscriber {
  id!: string;
  organizationId!: string;
  /** Trimmed and lower-cased; unique within the organization. */
  email!: string;
  name: string | null = null;
  phone: string | null = null;
  status!: SubscriberStatus;
  fields: Record<string, string> = {};
  /** Net revenue in integer cents (payments minus refunds). */
  revenue = 0;
  signupIp: string | null = null;
  signupCountry: string | null = null;
  confirmedAt: Date | null = null;
  confirmIp: string | null = null;
  confirmUserAgent: string | null = null;
  unsubscribedAt: Date | null = null;
  createdAt: Date = new Date();
  updatedAt: Date = new Date();
}

export const SubscriberSchema = new EntitySchema<Subscriber>({
  class: Subscriber,
  tableName: 'subscribers',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    email: { type: 'text' },
    name: { type: 'text', nullable: true },
    phone: { type: 'text', nullable: true },
    status: { type: 'string' },
    fields: { type: 'json' },
    // pg returns bigint as text; revenue stays within Number.MAX_SAFE_INTEGER cents.
    revenue: { type: new BigIntType('number') },
    signupIp: { type: 'text', nullable: true },
    signupCountry: { type: 'string', nullable: true },
    confirmedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    confirmIp: { type: 'text', nullable: true },
    confirmUserAgent: { type: 'text', nullable: true },
    unsubscribedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
    updatedAt: { type: 'Date', columnType: 'timestamptz(3)', onUpdate: () => new Date() },
  },
});

import { EntitySchema } from '@mikro-orm/core';

export type SuppressionReason = 'hard_bounce' | 'complaint';

/** An address of an organization that is never handed to the provider again (docs/outcomes.md "Suppression"). */
export class Suppression {
  organizationId!: string;
  /** Trimmed and lower-cased. */
  address!: string;
  reason!: SuppressionReason;
  emailId: string | null = null;
  createdAt: Date = new Date();
}

export const SuppressionSchema = new EntitySchema<Suppression>({
  class: Suppression,
  tableName: 'suppressions',
  properties: {
    organizationId: { type: 'string', primary: true },
    address: { type: 'text', primary: true },
    reason: { type: 'string' },
    emailId: { type: 'string', nullable: true },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
  },
});

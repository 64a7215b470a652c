import { EntitySchema } from '@mikro-orm/core';

/** Global (not per organization) outcomes of one normalized address; see src/shared/verification/history.ts. */
export class VerificationHistory {
  email!: string;
  domain!: string;
  hardBouncedAt!: Date | null;
  complainedAt!: Date | null;
  suppressed = false;
  mailboxFullAt!: Date | null;
  mailboxNotFoundAt!: Date | null;
  provenAt!: Date | null;
  updatedAt: Date = new Date();
}

export const VerificationHistorySchema = new EntitySchema<VerificationHistory>({
  class: VerificationHistory,
  tableName: 'verification_history',
  properties: {
    email: { type: 'text', primary: true },
    domain: { type: 'text' },
    hardBouncedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    complainedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    suppressed: { type: 'boolean' },
    mailboxFullAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    mailboxNotFoundAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    provenAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    updatedAt: { type: 'Date', columnType: 'timestamptz(3)' },
  },
});

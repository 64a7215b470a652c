import { EntitySchema } from '@mikro-orm/core';

export class EmailVerification {
  id!: string;
  organizationId!: string;
  email!: string;
  result!: string;
  accept!: boolean;
  status!: string;
  score!: number | null;
  suggestion!: string | null;
  traits!: Record<string, unknown>;
  issues!: Array<Record<string, unknown>>;
  retryAt!: Date | null;
  cacheHit!: boolean;
  createdAt: Date = new Date();
}

export const EmailVerificationSchema = new EntitySchema<EmailVerification>({
  class: EmailVerification,
  tableName: 'email_verifications',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    email: { type: 'text' },
    result: { type: 'string' },
    accept: { type: 'boolean' },
    status: { type: 'string' },
    score: { type: 'integer', nullable: true },
    suggestion: { type: 'text', nullable: true },
    traits: { type: 'json' },
    issues: { type: 'json' },
    retryAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    cacheHit: { type: 'boolean' },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
  },
});

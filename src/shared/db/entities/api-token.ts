import { EntitySchema } from '@mikro-orm/core';

export class ApiToken {
  id!: string;
  organizationId!: string;
  name!: string;
  /** SHA-256 (hex) of the secret: what a request's bearer token is looked up by. */
  tokenHash!: string;
  /** The secret sealed with the SecretBox, kept only so `reuseIfExists` can return it. */
  secretSealed!: string;
  last4!: string;
  permissions!: string[];
  createdAt: Date = new Date();
}

export const ApiTokenSchema = new EntitySchema<ApiToken>({
  class: ApiToken,
  tableName: 'api_tokens',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    name: { type: 'string' },
    tokenHash: { type: 'string' },
    secretSealed: { type: 'text' },
    last4: { type: 'string' },
    permissions: { type: 'json' },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
  },
});

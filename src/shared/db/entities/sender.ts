import { EntitySchema } from '@mikro-orm/core';

/** A from-identity on one of the organization's domains; campaigns refer to it by id. */
export class Sender {
  id!: string;
  organizationId!: string;
  domainId!: string;
  name!: string;
  /** Lower-case address, its domain in ASCII (punycode). */
  email!: string;
  createdAt: Date = new Date();
}

export const SenderSchema = new EntitySchema<Sender>({
  class: Sender,
  tableName: 'senders',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    domainId: { type: 'string' },
    name: { type: 'string' },
    email: { type: 'string' },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
  },
});

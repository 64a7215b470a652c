import { EntitySchema } from '@mikro-orm/core';

export class Organization {
  id!: string;
  name!: string;
  doubleOptIn = false;
  verifyQuota!: number;
  trackOpens = true;
  trackClicks = true;
  createdAt: Date = new Date();
  updatedAt: Date = new Date();
}

export const OrganizationSchema = new EntitySchema<Organization>({
  class: Organization,
  tableName: 'organizations',
  properties: {
    id: { type: 'string', primary: true },
    name: { type: 'string' },
    doubleOptIn: { type: 'boolean' },
    verifyQuota: { type: 'integer' },
    trackOpens: { type: 'boolean' },
    trackClicks: { type: 'boolean' },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
    updatedAt: { type: 'Date', columnType: 'timestamptz(3)', onUpdate: () => new Date() },
  },
});

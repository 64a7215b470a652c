import { EntitySchema } from '@mikro-orm/core';

export const DOMAIN_STATUSES = ['NOT_STARTED', 'PENDING', 'VERIFIED', 'FAILED'] as const;
export type DomainStatus = (typeof DOMAIN_STATUSES)[number];

export type DnsRecordPurpose = 'dkim' | 'spf' | 'dmarc' | 'return_path';

/** One record the user publishes; `status` is that record's own verification state. */
export interface DomainDnsRecord {
  type: 'TXT' | 'MX';
  /** Fully qualified. */
  name: string;
  value: string;
  priority: number | null;
  ttl: number;
  purpose: DnsRecordPurpose;
  status: DomainStatus;
}

export class Domain {
  id!: string;
  organizationId!: string;
  /** Lower-case ASCII (punycode) hostname. */
  domain!: string;
  region!: string;
  status: DomainStatus = 'NOT_STARTED';
  dkimSelector!: string;
  /** PKCS#8 PEM sealed with the SecretBox. */
  dkimPrivateKeySealed!: string;
  dnsRecords!: DomainDnsRecord[];
  mailProviderRecords: unknown[] = [];
  message: string | null = null;
  /** Start of the current PENDING period: FAILED 72 hours after it. */
  pendingSince: Date | null = null;
  lastCheckedAt: Date | null = null;
  nextCheckAt: Date | null = null;
  verifiedAt: Date | null = null;
  createdAt: Date = new Date();
  updatedAt: Date = new Date();
}

export const DomainSchema = new EntitySchema<Domain>({
  class: Domain,
  tableName: 'domains',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    domain: { type: 'string' },
    region: { type: 'string' },
    status: { type: 'string' },
    dkimSelector: { type: 'string' },
    dkimPrivateKeySealed: { type: 'text' },
    dnsRecords: { type: 'json' },
    mailProviderRecords: { type: 'json' },
    message: { type: 'text', nullable: true },
    pendingSince: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    lastCheckedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    nextCheckAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    verifiedAt: { type: 'Date', columnType: 'timestamptz(3)', nullable: true },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
    updatedAt: { type: 'Date', columnType: 'timestamptz(3)', onUpdate: () => new Date() },
  },
});

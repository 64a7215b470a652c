import type { SubscriberStatus } from '../db/entities/index.js';

/** A subscriber as the audience module reads it with SQL (`select s.*`). */
export interface SubscriberRow {
  id: string;
  organization_id: string;
  email: string;
  name: string | null;
  phone: string | null;
  status: SubscriberStatus;
  fields: Record<string, string>;
  revenue: string | number;
  signup_ip: string | null;
  signup_country: string | null;
  // Timestamps come back as text from the driver MikroORM configures.
  confirmed_at: Date | string | null;
  confirm_ip: string | null;
  confirm_user_agent: string | null;
  unsubscribed_at: Date | string | null;
  created_at: Date | string;
  updated_at: Date | string;
}

export interface TagRef {
  id: string;
  name: string;
}

export interface SubscriberRecord {
  id: string;
  organizationId: string;
  email: string;
  name: string | null;
  phone: string | null;
  status: SubscriberStatus;
  fields: Record<string, string>;
  /** Net revenue in integer cents. */
  revenue: number;
  createdAt: Date;
  updatedAt: Date;
  tags: TagRef[];
}

export function toRecord(row: SubscriberRow, tags: TagRef[]): SubscriberRecord {
  return {
    id: row.id,
    organizationId: row.organization_id,
    email: row.email,
    name: row.name,
    phone: row.phone,
    status: row.status,
    fields: row.fields ?? {},
    revenue: Number(row.revenue),
    createdAt: new Date(row.created_at),
    updatedAt: new Date(row.updated_at),
    tags,
  };
}

/** Tags are shown by name, case-insensitively, so lists read the same every time. */
export function byName(a: TagRef, b: TagRef): number {
  const x = a.name.toLowerCase();
  const y = b.name.toLowerCase();
  return x < y ? -1 : x > y ? 1 : a.id < b.id ? -1 : 1;
}

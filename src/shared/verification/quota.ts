import type { EntityManager } from '@mikro-orm/postgresql';
import { NotFoundError } from '../errors.js';
import { selectQuota } from './queries.js';
import { monthOf } from './verify.js';

/** The organization's verification quota this UTC month, read without taking any (rule 10 of docs/verification.md). */
export async function readVerificationQuota(
  em: EntityManager,
  organizationId: string,
  now: Date,
): Promise<{ limit: number; used: number; remaining: number; resetsAt: Date }> {
  const { month, resetsAt } = monthOf(now);
  const row = await selectQuota(em, organizationId, month);
  if (!row) throw new NotFoundError(`No organization ${organizationId}`);
  const limit = Number(row.limit);
  const used = Math.min(Number(row.used ?? 0), limit);
  return { limit, used, remaining: Math.max(0, limit - used), resetsAt };
}

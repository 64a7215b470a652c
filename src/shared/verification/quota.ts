import type { EntityManager } from '@mikro-orm/postgresql';
import { NotFoundError } from '../errors.js';
import { monthOf } from './verify.js';

/** The organization's verification quota this UTC month, read without taking any (spec 4.3 rule 10). */
export async function readVerificationQuota(
  em: EntityManager,
  organizationId: string,
  now: Date,
): Promise<{ limit: number; used: number; remaining: number; resetsAt: Date }> {
  const { month, resetsAt } = monthOf(now);
  const rows = await em.execute<{ limit: number; used: number | null }[]>(
    `select o.verify_quota as limit, q.used from organizations o
       left join verification_quotas q on q.organization_id = o.id and q.month = ?::date
      where o.id = ?`,
    [month, organizationId],
    'all',
  );
  const row = rows[0];
  if (!row) throw new NotFoundError(`No organization ${organizationId}`);
  const limit = Number(row.limit);
  const used = Math.min(Number(row.used ?? 0), limit);
  return { limit, used, remaining: Math.max(0, limit - used), resetsAt };
}

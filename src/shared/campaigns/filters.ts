import type { EntityManager } from '@mikro-orm/postgresql';
import { z } from 'zod';
import type { RecipientFilter } from '../db/entities/campaign.js';

/**
 * Recipient filters (contract 8): all must hold, and recipients are always SUBSCRIBED
 * contacts of the organization. Tags are matched by name, case-insensitively (tag names are
 * unique per organization regardless of case); custom fields compare their string value.
 */
const TagFilter = z.strictObject({
  type: z.literal('tag'),
  op: z.enum(['has', 'not_has']),
  value: z.string().trim().min(1, 'a tag name is required').max(100),
});

const FieldFilter = z
  .strictObject({
    type: z.literal('field'),
    name: z.string().trim().min(1, 'a field name is required').max(100),
    op: z.enum(['eq', 'neq', 'exists', 'not_exists']),
    value: z.string().max(1000).optional(),
  })
  .superRefine((f, ctx) => {
    if ((f.op === 'eq' || f.op === 'neq') && f.value === undefined) ctx.addIssue({ code: 'custom', path: ['value'], message: `is required with op ${f.op}` });
    if ((f.op === 'exists' || f.op === 'not_exists') && f.value !== undefined) ctx.addIssue({ code: 'custom', path: ['value'], message: `is not allowed with op ${f.op}` });
  });

export const RecipientFilterSchema = z.discriminatedUnion('type', [TagFilter, FieldFilter]);
export const RecipientFiltersSchema = z.array(RecipientFilterSchema).max(50, 'at most 50 filters');

/** The WHERE clause (on alias `s`) and its parameters. */
export function recipientWhere(organizationId: string, filters: readonly RecipientFilter[]): { sql: string; params: unknown[] } {
  const clauses = [`s.organization_id = ?`, `s.status = 'SUBSCRIBED'`];
  const params: unknown[] = [organizationId];
  for (const f of filters) {
    if (f.type === 'tag') {
      const exists = `exists (select 1 from subscriber_tags st join tags t on t.id = st.tag_id
        where st.subscriber_id = s.id and t.organization_id = s.organization_id and lower(t.name) = lower(?))`;
      clauses.push(f.op === 'has' ? exists : `not ${exists}`);
      params.push(f.value);
    } else if (f.op === 'eq') {
      clauses.push(`s.fields ->> ? = ?`);
      params.push(f.name, f.value);
    } else if (f.op === 'neq') {
      clauses.push(`(s.fields ->> ?) is distinct from ?`);
      params.push(f.name, f.value);
    } else {
      clauses.push(`s.fields ->> ? is ${f.op === 'exists' ? 'not ' : ''}null`);
      params.push(f.name);
    }
  }
  return { sql: clauses.join(' and '), params };
}

/** How many contacts match now: one SQL count. */
export async function countRecipients(em: EntityManager, organizationId: string, filters: readonly RecipientFilter[]): Promise<number> {
  const where = recipientWhere(organizationId, filters);
  const [row] = await em.execute<{ n: string }[]>(`select count(*) as n from subscribers s where ${where.sql}`, where.params, 'all');
  return Number(row?.n ?? 0);
}

import { z } from 'zod';

/**
 * Recipient filters (docs/campaigns.md "Recipient filters"): all must hold, and recipients are
 * always SUBSCRIBED contacts of the organization. Tags are matched by name, case-insensitively (tag
 * names are unique per organization regardless of case); custom fields compare their string value.
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

import { z } from 'zod';
import { wholeNumber } from '../shared/whole-number.js';

/** The list envelope (docs/foundation.md "Identifiers, time and lists"): `{ object: "list", has_more, data }`. */
export function listEnvelope<T extends z.ZodType>(item: T) {
  return z.object({ object: z.literal('list'), has_more: z.boolean(), data: z.array(item) });
}

export function list<T>(data: T[], hasMore: boolean) {
  return { object: 'list' as const, has_more: hasMore, data };
}

/** A whole number in a query string, written in decimal digits (shared/whole-number.ts). */
export function wholeNumberQuery(min: number, max?: number) {
  let number = z.number().int().min(min);
  if (max !== undefined) number = number.max(max);
  return wholeNumber(number, max === undefined ? {} : { tooLarge: `must be at most ${max}` });
}

/** docs/foundation.md "Identifiers, time and lists": `limit` outside 1..100 is 422. */
export const limitQuery = wholeNumberQuery(1, 100);

/** docs/foundation.md "Identifiers, time and lists": ISO 8601 in UTC with milliseconds. */
export const Timestamp = z.string().describe('ISO 8601 UTC timestamp with milliseconds');

export function iso(date: Date): string;
export function iso(date: Date | null | undefined): string | null;
export function iso(date: Date | null | undefined): string | null {
  return date ? date.toISOString() : null;
}

export const ErrorSchema = z.object({
  name: z.string(),
  message: z.string(),
  statusCode: z.number().int(),
  details: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
});

import { z } from 'zod';

/**
 * How request bodies are validated, beyond each route's schema (docs/foundation.md,
 * "Validation"):
 *
 * - Unknown body fields are refused on every route: 422 `validation_error` naming the field
 *   ("colour: is not a field of this request"), so a misspelt optional field never passes
 *   silently. The one exception is the spec's: `PATCH /campaigns/{id}` ignores them and
 *   lists them in `warnings` (its schema is a loose object, left as it is).
 * - Messages are written for a person: "must be a string, got a number", "is required".
 */
export function strictBody(schema: unknown): unknown {
  if (schema instanceof z.ZodObject && schema.def.catchall === undefined) return schema.strict();
  // Through every wrapper: `.nullish()` is an optional of a nullable.
  if (schema instanceof z.ZodOptional || schema instanceof z.ZodNullable) {
    const inner = strictBody(schema.def.innerType) as z.ZodType;
    if (inner === schema.def.innerType) return schema;
    return schema instanceof z.ZodOptional ? inner.optional() : inner.nullable();
  }
  return schema;
}

/**
 * A query schema whose single-valued parameters refuse a repetition (`?limit=1&limit=2`) as
 * such ("is given more than once"), rather than as the number or text the repetition is not.
 */
export function singleValuedQuery(schema: unknown): unknown {
  if (!(schema instanceof z.ZodObject)) return schema;
  const once = (field: z.ZodType) =>
    z.preprocess((value, ctx) => {
      if (!Array.isArray(value)) return value;
      ctx.addIssue({ code: 'custom', message: 'is given more than once' });
      return z.NEVER;
    }, field);
  // Every v2 query parameter is single-valued (none takes a list).
  const shape = schema.shape as Record<string, z.ZodType>;
  return schema.safeExtend(Object.fromEntries(Object.entries(shape).map(([name, field]) => [name, once(field)])));
}

function kind(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return `a list of ${value.length}`;
  if (typeof value === 'object') return 'an object';
  if (typeof value === 'string') return 'a string';
  if (typeof value === 'number') {
    // `1e400` in JSON: no number a field can hold.
    if (!Number.isFinite(value)) return 'a number out of range';
    return Number.isInteger(value) ? 'a whole number' : 'a number';
  }
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  return typeof value;
}

const EXPECTED: Record<string, string> = {
  string: 'a string',
  number: 'a number',
  int: 'a whole number',
  boolean: 'true or false',
  array: 'a list',
  object: 'an object',
  record: 'an object',
  map: 'an object',
  date: 'a date',
  null: 'null',
};

type Issue = {
  code: string;
  origin?: string;
  minimum?: number | bigint;
  maximum?: number | bigint;
  inclusive?: boolean;
  expected?: string;
  input?: unknown;
  keys?: string[];
  errors?: Issue[][];
  values?: unknown[];
  message?: string;
  path?: PropertyKey[];
};

/** The message of a zod issue the route's schema left without one of its own. */
export function humanMessage(issue: Issue): string | undefined {
  switch (issue.code) {
    case 'invalid_type':
      if (issue.input === undefined) return 'is required';
      return `must be ${EXPECTED[issue.expected ?? ''] ?? issue.expected}, got ${kind(issue.input)}`;
    case 'unrecognized_keys': {
      const keys = issue.keys ?? [];
      return keys.length === 1
        ? `"${keys[0]}" is not a field of this request (check its spelling)`
        : `${keys.map((k) => `"${k}"`).join(', ')} are not fields of this request (check their spelling)`;
    }
    case 'too_small':
    case 'too_big':
      return boundMessage(issue);
    case 'invalid_value': {
      // An enum or a literal: the values it takes, in words ("must be one of "A", "B" or "C"").
      if (issue.input === undefined) return 'is required';
      const values = (issue.values ?? []).map((v) => JSON.stringify(v));
      if (values.length === 0) return undefined;
      const listed = values.length === 1 ? values[0] : `one of ${values.slice(0, -1).join(', ')} or ${values.at(-1)}`;
      return `must be ${listed}, got ${typeof issue.input === 'string' ? JSON.stringify(issue.input.slice(0, 100)) : kind(issue.input)}`;
    }
    case 'invalid_union': {
      if (issue.input === undefined) return 'is required';
      // The branch of the input's own kind says what is wrong with it: a list of two
      // addresses where one is allowed fails the list branch's length rule, and that rule's
      // message is the useful one, not "Invalid input".
      const branches = issue.errors ?? [];
      const relevant = branches.find((b) => b.length > 0 && !b.every((i) => i.code === 'invalid_type' && (i.path ?? []).length === 0));
      const first = relevant?.[0];
      if (first?.message) return first.message;
      const expected = branches.map((b) => b[0]).filter((i) => i?.code === 'invalid_type').map((i) => EXPECTED[i!.expected ?? ''] ?? i!.expected);
      if (expected.length > 0) return `must be ${[...new Set(expected)].join(' or ')}, got ${kind(issue.input)}`;
      return undefined;
    }
    default:
      return undefined;
  }
}

const plural = (n: number | bigint, one: string) => `${n} ${one}${n === 1 ? '' : 's'}`;

/** "must be at least 1", "must be at most 100 characters", "must have at least 1 item". */
function boundMessage(issue: Issue): string | undefined {
  const small = issue.code === 'too_small';
  const bound = small ? issue.minimum : issue.maximum;
  if (bound === undefined) return undefined;
  switch (issue.origin) {
    case 'number':
    case 'int':
      if (issue.inclusive === false) return `must be ${small ? 'greater' : 'less'} than ${bound}`;
      return `must be at ${small ? 'least' : 'most'} ${bound}`;
    case 'string':
      if (small && bound === 1) return 'must not be empty';
      return `must be at ${small ? 'least' : 'most'} ${plural(bound, 'character')}`;
    case 'array':
    case 'set':
      return `must have at ${small ? 'least' : 'most'} ${plural(bound, 'item')}`;
    default:
      return undefined;
  }
}

const customError = (issue: unknown) => humanMessage(issue as Issue);

/**
 * Installs the messages in zod's configuration, which is global to the process (zod's own
 * state, not ours): every app installs the same function, so installing again changes nothing.
 */
export function installValidationMessages(): void {
  z.config({ customError });
}

import { ValidationError } from './errors.js';

/**
 * Text PostgreSQL cannot store: U+0000 (in text and jsonb), or a UTF-16 surrogate without its
 * pair (`"\ud800"` is valid JSON, and jsonb refuses it: 22P02). Every input is checked for it
 * before anything is written (docs/foundation.md "Validation"): the API's bodies, queries and
 * paths as they arrive, and the JSON documents given as text once they are parsed.
 */
export const unstorable = (text: string): boolean => text.includes('\0') || !text.isWellFormed();

/** Text made storable: each NUL and unpaired surrogate becomes U+FFFD (for text from outside that is kept, not refused). */
export const storableText = (text: string): string => (unstorable(text) ? text.toWellFormed().replaceAll('\0', '\ufffd') : text);

export const UNSTORABLE_MESSAGE = 'must not contain a NUL character (U+0000) or an unpaired UTF-16 surrogate (such as \\ud800)';

/** The validation error of unstorable text found at `where` (a field's path), as every interface answers it. */
export function unstorableError(where: string, status?: number): ValidationError {
  return new ValidationError(`${where}: ${UNSTORABLE_MESSAGE}`, [{ path: where, message: UNSTORABLE_MESSAGE }], status);
}

/**
 * The path (`a.b.0`, as validation details name it) of the first string holding unstorable
 * text in a parsed value, `part` itself when the value is that string, or undefined.
 * Keys count as well as values (jsonb refuses both). Iterative: a deeply nested value cannot
 * overflow the stack.
 */
export function unstorablePath(value: unknown, part: string): string | undefined {
  if (!hasUnstorable(value)) return undefined;
  const stack: Array<[unknown, string]> = [[value, '']];
  while (stack.length > 0) {
    const [current, path] = stack.pop()!;
    if (typeof current === 'string') {
      if (unstorable(current)) return path || part;
    } else if (current !== null && typeof current === 'object') {
      const at = (key: string) => (path ? `${path}.${key}` : key);
      if (Array.isArray(current)) {
        for (let i = current.length - 1; i >= 0; i--) stack.push([current[i], at(String(i))]);
      } else {
        for (const key of Object.keys(current)) {
          if (unstorable(key)) return at(key.replace(/\0/g, '\\0').toWellFormed());
          stack.push([(current as Record<string, unknown>)[key], at(key)]);
        }
      }
    }
  }
  return undefined;
}

/** The walk of `unstorablePath` without building paths: the common case, nothing found, allocates little. */
export function hasUnstorable(value: unknown): boolean {
  if (typeof value === 'string') return unstorable(value);
  if (value === null || typeof value !== 'object') return false;
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const current = stack.pop();
    if (typeof current === 'string') {
      if (unstorable(current)) return true;
    } else if (Array.isArray(current)) {
      for (const item of current) stack.push(item);
    } else if (current !== null && typeof current === 'object') {
      for (const key in current) {
        if (!Object.hasOwn(current, key)) continue;
        if (unstorable(key)) return true;
        stack.push((current as Record<string, unknown>)[key]);
      }
    }
  }
  return false;
}

/**
 * The problem of a JSON document given as text (a tiptap or Maily document in a string) whose
 * parsed text cannot be stored: `"\u0000"` passes the check of the raw request (it is six
 * characters there) and becomes U+0000 once parsed. Undefined when it can be stored.
 */
export function unstorableInJsonText(parsed: unknown): string | undefined {
  const where = unstorablePath(parsed, '');
  if (where === undefined) return undefined;
  return where ? `${UNSTORABLE_MESSAGE} (its JSON text has one at ${where})` : UNSTORABLE_MESSAGE;
}

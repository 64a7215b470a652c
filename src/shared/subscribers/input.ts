// The codes alone: the package's main entry also loads the country names in 78 languages.
import countries from 'i18n-iso-countries/index.js';
import { z } from 'zod';
import { parseAddress } from '../verification/syntax.js';
import { isId } from '../ids.js';

/**
 * Input rules of the audience module shared by the API and the CSV import
 * (docs/audience.md "Writes"). Bad input as a whole is refused (422); a single tag or field that
 * cannot be applied is skipped with a warning naming it, and the rest is written.
 */

/**
 * Checked by the verifier's syntax rule (docs/verification.md rule 1: a dot-atom local part of
 * at most 64 octets, a host name, an IDN domain stored in its ASCII form), trimmed and
 * lower-cased: an organization has one subscriber per address.
 */
export const EmailAddress = z
  .string()
  .trim()
  .max(254, 'must be at most 254 characters')
  .transform((value, ctx) => {
    const parsed = parseAddress(value);
    if (parsed.ok) return parsed.email;
    ctx.addIssue({ code: 'custom', message: `must be a valid email address: ${parsed.reason}` });
    return z.NEVER;
  });

/** An address as it is stored (EmailAddress's form, an IDN domain in ASCII), to look one up by. */
export function normalizeEmail(value: string): string {
  const parsed = parseAddress(value);
  return parsed.ok ? parsed.email : value.trim().toLowerCase();
}

/** ISO 3166-1 alpha-2, any case on input, stored upper-case. */
export const CountryCode = z
  .string()
  // For the JSON Schema (tools, OpenAPI); the refinement below is the check.
  .meta({ pattern: '^\\s*[A-Za-z]{2}\\s*$' })
  .trim()
  .toUpperCase()
  .refine((code) => code.length === 2 && countries.isValid(code), 'must be an ISO 3166-1 alpha-2 country code');

export const IpAddress = z.union([z.ipv4(), z.ipv6()], { message: 'must be an IPv4 or IPv6 address' });

export const TAG_NAME_MAX = 100;
/** Tags and custom fields one write may give a subscriber (API, tools, import row); more is refused as a whole (422, a skipped row). */
export const TAGS_MAX = 100;
export const FIELDS_MAX = 100;
export const FIELD_NAME = /^[A-Za-z][A-Za-z0-9_]{0,63}$/;
export const FIELD_VALUE_MAX = 10_000;

// The tag paths read `:tag` as an id first (docs/audience.md: "an id or the current name"): a name in
// the form of a tag id could name two tags, and its own would be out of reach.
const ID_FORM = 'must not be in the form of a tag id (tag_ and 26 characters), which the tag paths read as an id';

/** Tag name of the tag endpoints (docs/audience.md): 1 to 100 characters after trimming. */
export const TagName = z
  .string()
  .trim()
  .min(1, 'must be 1 to 100 characters')
  .max(TAG_NAME_MAX, 'must be 1 to 100 characters')
  .refine((name) => !isId(name, 'tag'), ID_FORM);

// Lengths in characters (code points), as zod and PostgreSQL count them: an emoji is one.
const characters = (value: string) => [...value].length;

function shown(value: string): string {
  return characters(value) > 40 ? `${[...value].slice(0, 40).join('')}…` : value;
}

/** Usable tag names (trimmed, de-duplicated regardless of case) and a warning per bad one. */
export function cleanTagNames(names: readonly string[] | undefined, options: { adding: boolean } = { adding: true }): { names: string[]; warnings: string[] } {
  const out = new Map<string, string>();
  const warnings: string[] = [];
  for (const raw of names ?? []) {
    const name = raw.trim();
    if (name.length === 0 || characters(name) > TAG_NAME_MAX) {
      warnings.push(`tag "${shown(raw)}" was not applied: a tag name is 1 to ${TAG_NAME_MAX} characters`);
      continue;
    }
    // Only a new name is refused in id form: one made before the rule can still be detached.
    if (options.adding && isId(name, 'tag')) {
      warnings.push(`tag "${name}" was not applied: a tag name ${ID_FORM}`);
      continue;
    }
    if (!out.has(name.toLowerCase())) out.set(name.toLowerCase(), name);
  }
  return { names: [...out.values()], warnings };
}

export interface CleanFields {
  /** Fields to set. */
  set: Record<string, string>;
  /** Fields to remove (given as null). */
  remove: string[];
  warnings: string[];
}

/** Splits a `fields` map into values to set and names to remove; bad names or values warn. */
export function cleanFields(fields: Record<string, string | null> | undefined): CleanFields {
  const result: CleanFields = { set: {}, remove: [], warnings: [] };
  for (const [name, value] of Object.entries(fields ?? {})) {
    if (!FIELD_NAME.test(name)) {
      result.warnings.push(
        `field "${shown(name)}" was not applied: a field name starts with a letter and has at most 64 letters, digits or _`,
      );
    } else if (value === null) {
      result.remove.push(name);
    } else if (characters(value) > FIELD_VALUE_MAX) {
      result.warnings.push(`field "${name}" was not applied: its value is longer than ${FIELD_VALUE_MAX} characters`);
    } else {
      result.set[name] = value;
    }
  }
  return result;
}

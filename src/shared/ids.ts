import { randomFraction } from './crypto.js';
import { monotonicFactory } from 'ulid';

export const ID_PREFIXES = ['org', 'tok', 'sub', 'tag', 'cmp', 'eml', 'dom', 'snd', 'evt', 'ver', 'usr', 'whk', 'msg', 'rpt'] as const;
export type IdPrefix = (typeof ID_PREFIXES)[number];

// ulid's own generator asks the OS for one byte per character (16 calls an id whenever the
// millisecond changes): 40 us an id, a tenth of the CPU of a single send.
const ulid = monotonicFactory(randomFraction);

/**
 * A prefixed id whose body is a lower-case ULID: URL-safe, and sortable by creation time
 * both as text and within one process (the factory is monotonic within a millisecond).
 */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${ulid().toLowerCase()}`;
}

export function isId(value: string, prefix: IdPrefix): boolean {
  return value.length === prefix.length + 27 && value.startsWith(`${prefix}_`) && /^[0-9a-hjkmnp-tv-z]{26}$/.test(value.slice(prefix.length + 1));
}

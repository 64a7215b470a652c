/**
 * Reads header-style fields (`Name: value`, continuation lines start with white space), the
 * syntax of RFC 5322 headers and of the blocks of RFC 3464 and RFC 5965 report parts. One
 * pass over the lines, no regular expression over the whole text: linear in its length.
 */

export type Fields = Map<string, string>;

/** Blocks separated by blank lines, each a map of lower-cased field names to values (first wins). */
export function parseFieldBlocks(text: string, maxBlocks = 100): Fields[] {
  const blocks: Fields[] = [];
  let current: Fields | undefined;
  let name: string | undefined;
  for (const line of text.split('\n')) {
    const clean = line.endsWith('\r') ? line.slice(0, -1) : line;
    if (clean.trim() === '') {
      current = undefined;
      name = undefined;
      continue;
    }
    if ((clean[0] === ' ' || clean[0] === '\t') && current && name !== undefined) {
      current.set(name, `${current.get(name) ?? ''} ${clean.trim()}`);
      continue;
    }
    const colon = clean.indexOf(':');
    if (colon <= 0) continue;
    if (!current) {
      if (blocks.length >= maxBlocks) break;
      current = new Map();
      blocks.push(current);
    }
    const key = clean.slice(0, colon).trim().toLowerCase();
    // A repeated field keeps its first value (the top-most header is the latest one added).
    if (current.has(key)) {
      name = undefined;
      continue;
    }
    name = key;
    current.set(key, clean.slice(colon + 1).trim());
  }
  return blocks;
}

/** The header block of a message or header part: the fields before the first blank line. */
export function parseHeaderBlock(text: string): Fields {
  const end = text.search(/\r?\n\r?\n/);
  return parseFieldBlocks(end < 0 ? text : text.slice(0, end), 1)[0] ?? new Map();
}

/** `rfc822; a@b` (RFC 3464 address types) or `<a@b>` to `a@b`, lower-cased; null when empty. */
export function bareAddress(value: string | undefined): string | null {
  if (!value) return null;
  let v = value.trim();
  const semi = v.indexOf(';');
  if (semi >= 0 && semi < 20) v = v.slice(semi + 1).trim();
  const open = v.lastIndexOf('<');
  const close = v.lastIndexOf('>');
  if (open >= 0 && close > open) v = v.slice(open + 1, close);
  v = v.trim().toLowerCase();
  return v.includes('@') ? v : null;
}

/** The bare addresses of an email's copy recipients as stored (`addr` or `Name <addr>`), the unreadable left out. */
export function bareAddresses(values: readonly string[]): string[] {
  return values.map((value) => bareAddress(value)).filter((address): address is string => address !== null);
}

/** `<id@host>` to `id@host`; null when empty. */
export function bareMessageId(value: string | undefined): string | null {
  if (!value) return null;
  const v = value.trim();
  const open = v.indexOf('<');
  const close = v.indexOf('>', open + 1);
  const id = (open >= 0 && close > open ? v.slice(open + 1, close) : v).trim();
  return id === '' ? null : id;
}

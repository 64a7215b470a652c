/**
 * The deepest JSON may nest (objects and arrays), in a request body or in JSON given as text (a
 * tiptap document, a campaign's content). The service walks such values recursively
 * (validation, then JSON columns, which PostgreSQL's driver writes with JSON.stringify): a body
 * of a few thousand levels overflowed the stack, a 500 for a 35 KB request. No request needs
 * more than a few dozen; a tiptap document of 250 nested elements fits.
 */
const MAX_JSON_DEPTH = 512;
export const JSON_TOO_DEEP = `is nested deeper than ${MAX_JSON_DEPTH} levels`;

/** Whether `text` holds more than `max` of `character` (indexOf: native speed, and it stops at max + 1). */
function moreThan(text: string, character: string, max: number): boolean {
  let count = 0;
  for (let at = text.indexOf(character); at !== -1; at = text.indexOf(character, at + 1)) if (++count > max) return true;
  return false;
}

/**
 * Whether JSON text opens more than `max` objects or arrays at once. This runs on every request
 * body: text with no more than `max` brackets of either kind (nearly every body) is answered by
 * counting them, natively; otherwise one pass, strings skipped over their escapes.
 */
export function jsonNestedDeeperThan(text: string, max = MAX_JSON_DEPTH): boolean {
  // Each level takes a character: shorter text, or text with fewer brackets, cannot go deeper.
  if (text.length <= max || (!moreThan(text, '{', max / 2) && !moreThan(text, '[', max / 2))) return false;
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // A string: to its closing quote, over escaped characters.
      for (i++; i < text.length; i++) {
        const d = text.charCodeAt(i);
        if (d === 0x5c) i++;
        else if (d === 0x22) break;
      }
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > max) return true;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    }
  }
  return false;
}

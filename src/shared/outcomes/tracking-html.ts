import { parse, parseFragment, type DefaultTreeAdapterMap } from 'parse5';
import type { LinkSigner } from '../crypto.js';
import { clickToken, openToken } from './tokens.js';

type Node = DefaultTreeAdapterMap['node'];
type Element = DefaultTreeAdapterMap['element'];

export interface TrackingOptions {
  emailId: string;
  trackOpens: boolean;
  trackClicks: boolean;
  /** PUBLIC_URL without a trailing slash. */
  publicUrl: string;
  signer: LinkSigner;
}

/** A link found in the source: the whole `href=...` attribute and its decoded value. */
interface Link {
  start: number;
  end: number;
  url: string;
}

const escapeAttribute = (value: string) => value.replace(/&/g, '&amp;').replace(/"/g, '&quot;');

/**
 * The HTML handed to the transport: the stored body (which stays without tracking,
 * docs/emails.md "Rendering") with its http(s) links rewritten to `/t/c/{token}` and a 1x1 pixel
 * `/t/o/{token}.gif` before `</body>`.
 *
 * Only the `href` values change and the rest of the document is kept byte for byte (no
 * re-serialisation). Not rewritten: `mailto:`, `tel:`, anchors, relative or templated links
 * (`{{unsubscribe_url}}`), and the service's own unsubscribe (`/u/`) and tracking links.
 */
export function addTracking(html: string, options: TrackingOptions): string {
  if (!options.trackOpens && !options.trackClicks) return html;
  const found = scanTags(html) ?? parseTags(html);
  const edits: { start: number; end: number; text: string }[] = [];
  if (options.trackClicks) {
    let index = 0;
    for (const link of found.links) {
      const url = link.url.trim();
      if (!isTrackable(url, options.publicUrl)) continue;
      const token = clickToken(options.signer, options.emailId, index++, url);
      edits.push({ start: link.start, end: link.end, text: `href="${escapeAttribute(`${options.publicUrl}/t/c/${token}`)}"` });
    }
  }
  if (options.trackOpens) {
    const src = `${options.publicUrl}/t/o/${openToken(options.signer, options.emailId)}.gif`;
    const pixel = `<img src="${escapeAttribute(src)}" width="1" height="1" alt="" style="display:block;width:1px;height:1px;border:0;margin:0;padding:0">`;
    const at = found.bodyEnd ?? html.length;
    edits.push({ start: at, end: at, text: pixel });
  }
  if (edits.length === 0) return html;
  // In source order, so the document is copied once around the edits.
  edits.sort((a, b) => a.start - b.start);
  let out = '';
  let from = 0;
  for (const edit of edits) {
    out += html.slice(from, edit.start) + edit.text;
    from = edit.end;
  }
  return out + html.slice(from);
}

// The HTML tokenizer's rules (WHATWG 13.2.5) for what we need of a document: the start tags
// of `a` and `area` with the source span of their first `href` attribute, in source order,
// and where the first `</body>` is. Comments, doctypes, the attributes of every tag (a `>`
// may sit in a quoted value) and the raw text of script, style, title, textarea... are
// skipped as the tokenizer does. A scan, not a parse: the body of a send is handed over
// thousands of times a second, and a full parse (tree construction included) was the
// largest single cost of a tracked send. Documents with foreign content (SVG, MathML: CDATA
// and raw-text rules differ there) or an escaped script go to parse5 instead.
const FOREIGN = /<(?:svg|math)[\t\n\f\r />]/i;
// Elements whose content is text up to their end tag (RCDATA, RAWTEXT, script data; noscript
// too, as parse5 parses with scripting on).
const RAW_TEXT = new Set(['script', 'style', 'xmp', 'iframe', 'noembed', 'noframes', 'noscript', 'title', 'textarea']);
// The end tag of each: made once, never added to (a regex's lastIndex is set before each
// synchronous use, so sharing them is safe).
const RAW_TEXT_ENDS: ReadonlyMap<string, RegExp> = new Map([...RAW_TEXT].map((name) => [name, new RegExp(`</${name}[\\t\\n\\f\\r />]`, 'ig')]));

const isSpace = (c: number) => c === 0x20 || c === 0x0a || c === 0x09 || c === 0x0c || c === 0x0d;
const isAlpha = (c: number) => (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a);

/** Links and `</body>` of a document, or undefined when only a full parse can tell. */
export function scanTags(html: string): { links: Link[]; bodyEnd?: number } | undefined {
  if (FOREIGN.test(html)) return undefined;
  const links: Link[] = [];
  let bodyEnd: number | undefined;
  const n = html.length;
  let i = 0;
  for (;;) {
    const lt = html.indexOf('<', i);
    if (lt < 0 || lt + 1 >= n) break;
    const c = html.charCodeAt(lt + 1);
    if (c === 0x21 /* ! */) {
      if (html.startsWith('--', lt + 2)) {
        // Comment: `<!-->` and `<!--->` end at once; else at `-->` or `--!>`.
        const j = lt + 4;
        if (html.charCodeAt(j) === 0x3e) {
          i = j + 1;
          continue;
        }
        if (html.startsWith('->', j)) {
          i = j + 2;
          continue;
        }
        const a = html.indexOf('-->', j);
        const b = html.indexOf('--!>', j);
        if (a < 0 && b < 0) break;
        i = b < 0 || (a >= 0 && a < b) ? a + 3 : b + 4;
        continue;
      }
      // Doctype, CDATA outside foreign content, other markup: up to the first `>`.
      const gt = html.indexOf('>', lt + 2);
      if (gt < 0) break;
      i = gt + 1;
      continue;
    }
    if (c === 0x3f /* ? */) {
      const gt = html.indexOf('>', lt + 2);
      if (gt < 0) break;
      i = gt + 1;
      continue;
    }
    if (c === 0x2f /* / */) {
      const c2 = html.charCodeAt(lt + 2);
      if (isAlpha(c2)) {
        const tag = readTag(html, lt + 2, false);
        if (!tag) break;
        if (tag.name === 'body' && bodyEnd === undefined) bodyEnd = lt;
        i = tag.end;
      } else if (c2 === 0x3e /* > */) {
        i = lt + 3;
      } else {
        const gt = html.indexOf('>', lt + 2);
        if (gt < 0) break;
        i = gt + 1;
      }
      continue;
    }
    if (!isAlpha(c)) {
      i = lt + 1;
      continue;
    }
    const tag = readTag(html, lt + 1, true);
    if (!tag) break;
    i = tag.end;
    if (tag.href) links.push(tag.href);
    if (tag.name === 'plaintext') break;
    if (RAW_TEXT.has(tag.name)) {
      const end = RAW_TEXT_ENDS.get(tag.name)!;
      end.lastIndex = i;
      const found = end.exec(html);
      const close = found ? found.index : n;
      // A script with `<!--` has the tokenizer's escaped states: left to the parser.
      if (tag.name === 'script' && html.slice(i, close).includes('<!--')) return undefined;
      if (!found) break;
      i = close;
    }
  }
  return { links, bodyEnd };
}

/**
 * One tag from its name (at `at`) to after its `>`: the lower-cased name and, for a start
 * tag of `a` or `area`, its first `href` attribute. Undefined when the document ends inside
 * the tag (the tokenizer then emits nothing).
 */
function readTag(html: string, at: number, start: boolean): { name: string; end: number; href?: Link } | undefined {
  const n = html.length;
  let j = at;
  while (j < n) {
    const c = html.charCodeAt(j);
    if (isSpace(c) || c === 0x2f || c === 0x3e) break;
    j++;
  }
  const name = html.slice(at, j).toLowerCase();
  const wantHref = start && (name === 'a' || name === 'area');
  let href: Link | undefined;
  let hrefSeen = false;
  for (;;) {
    // Before an attribute name: spaces and stray `/` are skipped.
    while (j < n) {
      const c = html.charCodeAt(j);
      if (!isSpace(c) && c !== 0x2f) break;
      j++;
    }
    if (j >= n) return undefined;
    if (html.charCodeAt(j) === 0x3e) return { name, end: j + 1, href };
    // The name: its first character may be anything (even `=`).
    const nameStart = j;
    j++;
    while (j < n) {
      const c = html.charCodeAt(j);
      if (isSpace(c) || c === 0x2f || c === 0x3e || c === 0x3d) break;
      j++;
    }
    const nameEnd = j;
    while (j < n && isSpace(html.charCodeAt(j))) j++;
    let valueStart = -1;
    let valueEnd = -1;
    let attrEnd = nameEnd;
    if (j < n && html.charCodeAt(j) === 0x3d /* = */) {
      j++;
      while (j < n && isSpace(html.charCodeAt(j))) j++;
      if (j >= n) return undefined;
      const q = html.charCodeAt(j);
      if (q === 0x22 || q === 0x27) {
        const close = html.indexOf(q === 0x22 ? '"' : "'", j + 1);
        if (close < 0) return undefined;
        valueStart = j + 1;
        valueEnd = close;
        j = close + 1;
        attrEnd = j;
      } else if (q !== 0x3e) {
        valueStart = j;
        while (j < n) {
          const c = html.charCodeAt(j);
          if (isSpace(c) || c === 0x3e) break;
          j++;
        }
        valueEnd = j;
        attrEnd = j;
      }
    }
    // Only the first of duplicate attributes counts.
    if (wantHref && !hrefSeen && nameEnd - nameStart === 4 && html.slice(nameStart, nameEnd).toLowerCase() === 'href') {
      hrefSeen = true;
      const raw = valueStart < 0 ? '' : html.slice(valueStart, valueEnd);
      // Character references (`&amp;` ...) decoded by the parser's own rules.
      const url = raw.includes('&') ? decodeAttribute(html.slice(nameStart, attrEnd)) : raw;
      href = { start: nameStart, end: attrEnd, url };
    }
  }
}

function decodeAttribute(attribute: string): string {
  const element = parseFragment(`<a ${attribute}>`).childNodes[0] as Element | undefined;
  return element?.attrs.find((a) => a.name === 'href')?.value ?? '';
}

/** The same answer from a full parse (foreign content, escaped scripts). */
function parseTags(html: string): { links: Link[]; bodyEnd?: number } {
  const document = parse(html, { sourceCodeLocationInfo: true });
  const links: Link[] = [];
  const seen = new Set<number>();
  let bodyEnd: number | undefined;
  const visit = (node: Node): void => {
    if ('tagName' in node) {
      const element = node as Element;
      if (element.tagName === 'body') bodyEnd = element.sourceCodeLocation?.endTag?.startOffset;
      if (element.tagName === 'a' || element.tagName === 'area') {
        const href = element.attrs.find((a) => a.name === 'href' && !a.prefix);
        const location = element.sourceCodeLocation?.attrs?.href;
        // A misnested <a> is reconstructed by the parser with the same source span: once.
        if (href && location && !seen.has(location.startOffset)) {
          seen.add(location.startOffset);
          links.push({ start: location.startOffset, end: location.endOffset, url: href.value });
        }
      }
    }
    if ('childNodes' in node) for (const child of node.childNodes) visit(child);
    // <template> content is a fragment of its own.
    if ('content' in node && node.content) visit(node.content);
  };
  visit(document);
  links.sort((a, b) => a.start - b.start);
  return { links, bodyEnd };
}

function isTrackable(url: string, publicUrl: string): boolean {
  if (!/^https?:\/\//i.test(url)) return false;
  // Whitespace or control characters would not survive a Location header: left as they are.
  if (/[\s\u0000-\u001f\u007f]/.test(url)) return false;
  if (url.includes('{{') || url.includes('%7B%7B')) return false;
  // A link no browser could open either (`https://[::1/`): the redirect would have nowhere to go.
  if (!URL.canParse(url)) return false;
  const own = publicUrl.toLowerCase();
  const lower = url.toLowerCase();
  // The service's own links (unsubscribe, tracking, double opt-in confirmation, any page of
  // it) go where they say: a confirmation link is the address the subscriber is asked to
  // open (docs/outcomes.md "Tracking at send time"), and a redirect through the service to itself tracks nothing.
  if (lower.startsWith(`${own}/`)) return false;
  return true;
}

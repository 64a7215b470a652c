import { getSchema, type Extensions, type JSONContent } from '@tiptap/core';
import Image from '@tiptap/extension-image';
import { renderToHTMLString } from '@tiptap/static-renderer/pm/html-string';
import StarterKit from '@tiptap/starter-kit';
import { compile } from 'html-to-text';
import juice from 'juice';
import { Lexer, Marked, Tokenizer, type Tokens } from 'marked';
import type { ContentKind } from '../db/entities/email.js';
import { escapeHtml } from '../html.js';

/**
 * Server-side rendering of an email body (docs/emails.md "Rendering"): markdown (GFM) or a tiptap
 * document to HTML, wrapped in an email-safe layout, CSS inlined, `preview` as a hidden preheader,
 * and a plain-text part generated from the HTML when none was given. Runs in workers only.
 */

/** The tiptap nodes and marks the service understands (StarterKit + images). */
export const TIPTAP_EXTENSIONS: Extensions = [StarterKit, Image];

const tiptapSchema = getSchema(TIPTAP_EXTENSIONS);

/** Why a tiptap document is invalid, or undefined when it is a valid `doc`. */
export function tiptapProblem(doc: unknown): string | undefined {
  if (!doc || typeof doc !== 'object' || Array.isArray(doc)) return 'must be a tiptap JSON document (an object)';
  if ((doc as { type?: unknown }).type !== 'doc') return 'must be a tiptap document whose root type is "doc"';
  try {
    tiptapSchema.nodeFromJSON(doc).check();
    return undefined;
  } catch (error) {
    return `is not a valid tiptap document: ${(error as Error).message}`;
  }
}

/**
 * The largest content rendered, in characters (html, markdown, the tiptap JSON, the text
 * part): the request limit of a single send (1 MiB). Rendering is linear in the input, so
 * this bounds its time; larger content is refused at the API (422) and by renderEmail.
 */
export const MAX_CONTENT_CHARS = 1024 * 1024;

export class ContentTooLargeError extends Error {
  constructor(size: number) {
    super(`content of ${size} characters is over the limit of ${MAX_CONTENT_CHARS}`);
    this.name = 'ContentTooLargeError';
  }
}

/** HTML nested deeper than MAX_NESTING elements: no email needs it, and parsing it is not linear. */
export class ContentTooDeepError extends Error {
  constructor(message = `content is nested deeper than ${MAX_NESTING} elements`) {
    super(message);
    this.name = 'ContentTooDeepError';
  }
}

// An email's layout tables nest a few dozen deep; HTML parsers and text converters walk the
// tree recursively: 10,000 open elements overflowed the stack, 100,000 took seconds to parse.
export const MAX_NESTING = 1_000;
// Elements that hold no content, and those whose end tag may be left out (the next one closes
// them): neither deepens the tree by being opened.
const SCRIPT_END = /<\/script/gi;
const STYLE_END = /<\/style/gi;
const VOID_OR_OPTIONAL = new Set(
  'area base br col embed hr img input link meta source track wbr p li dt dd tr td th option optgroup thead tbody tfoot colgroup rb rt rtc rp'.split(' '),
);

/**
 * Whether HTML opens more than MAX_NESTING elements without closing them, counted in one pass
 * (a tag ends at the first `>` after it: without one, no tag follows; comments and the text
 * of `script` and `style` are skipped).
 */
export function nestedTooDeep(html: string): boolean {
  let depth = 0;
  for (let at = html.indexOf('<'); at !== -1; at = html.indexOf('<', at + 1)) {
    if (html.startsWith('<!--', at)) {
      at = html.indexOf('-->', at + 4);
      if (at === -1) return false;
      continue;
    }
    const end = html.indexOf('>', at + 1);
    if (end === -1) return false;
    const closing = html[at + 1] === '/';
    const name = /^[A-Za-z][A-Za-z0-9-]*/.exec(html.slice(at + (closing ? 2 : 1), Math.min(end, at + 40)))?.[0]?.toLowerCase();
    if (name === undefined) continue;
    if (closing) depth = Math.max(0, depth - 1);
    else if (name === 'script' || name === 'style') {
      const close = name === 'script' ? SCRIPT_END : STYLE_END;
      close.lastIndex = end;
      if (!close.exec(html)) return false;
      at = close.lastIndex - 1;
      continue;
    } else if (!VOID_OR_OPTIONAL.has(name) && html[end - 1] !== '/' && ++depth > MAX_NESTING) return true;
    at = Math.max(at, end - 1);
  }
  return false;
}

/**
 * The characters marked's emphasis matching may scan in one parse. For each `*` or `_` that
 * could open an emphasis, marked scans the rest of the paragraph for its closer: a paragraph
 * of delimiters that never close (`_a_a_a…`) is scanned once per delimiter, in the square of
 * its length (40,000 characters took 2 s; the content limit, about an hour). Past this budget
 * (about 100 ms of scanning), the delimiters left in the parse are written as they are, as
 * unmatched ones always are. A real email spends a fraction of it: a scan stops at its closer.
 */
const EMPHASIS_SCAN_BUDGET = 10_000_000;

// What a parse has scanned so far, kept on its lexer (marked makes one per parse).
type BudgetedLexer = { emphasisScanned?: number };

/**
 * GFM's inline rules with an email address's local part bounded to RFC 5321's 64 characters.
 * marked looks for a bare address (`jane@example.com`, linked by GFM) at every step of a
 * paragraph with `[…]+@`: where a long run of such characters has no `@` (`_a_a_a…`), each
 * step scanned the rest of the run, in the square of its length (80,000 characters took 6 s).
 * Bounded, a step scans 64 characters at most; every address that can exist is still linked.
 */
function boundedGfmInline(): typeof Lexer.rules.inline.gfm {
  const gfm = Lexer.rules.inline.gfm;
  const bound = (rule: RegExp, from: string, to: string) => {
    if (!rule.source.includes(from)) throw new Error(`marked's GFM rule changed: ${from} not found`);
    return new RegExp(rule.source.replaceAll(from, to), rule.flags);
  };
  return Object.freeze({
    ...gfm,
    text: bound(gfm.text, "`{\\|}~-]+@", "`{\\|}~-]{1,64}@"),
    url: bound(gfm.url, '^[A-Za-z0-9._+-]+(@)', '^[A-Za-z0-9._+-]{1,64}(@)'),
  });
}
const BOUNDED_GFM_INLINE = boundedGfmInline();

// Configured once and holding no state between parses: shared by every render.
const marked = new Marked({
  gfm: true,
  breaks: false,
  async: false,
  tokenizer: {
    // The two rules that look for a bare address, bounded (a parse's rules are its own object).
    url() {
      this.rules.inline = BOUNDED_GFM_INLINE;
      return false;
    },
    inlineText() {
      this.rules.inline = BOUNDED_GFM_INLINE;
      return false;
    },
    emStrong(src, maskedSrc, prevChar) {
      const lexer = this.lexer as unknown as BudgetedLexer;
      const scanned = lexer.emphasisScanned ?? 0;
      if (scanned > EMPHASIS_SCAN_BUDGET) {
        const delimiter = /^(?:\*+|_+)/.exec(src)?.[0];
        return delimiter ? ({ type: 'text', raw: delimiter, text: delimiter } as unknown as Tokens.Em) : undefined;
      }
      const token = Tokenizer.prototype.emStrong.call(this, src, maskedSrc, prevChar);
      // A match scanned up to its closer; a miss, the rest of the paragraph.
      lexer.emphasisScanned = scanned + (token ? token.raw.length : src.length);
      return token;
    },
  },
});

/**
 * The deepest markdown may nest block quotes and lists. The parser recurses into each level, and
 * its time and memory grow faster than the text: 1,440 lines of ever deeper quotes (1 MiB, the
 * content limit) took 1.6 s and 1.6 GB to render, 1,000 nested list items 4 s. No email nests
 * a hundred deep.
 */
const MAX_MARKDOWN_NESTING = 100;
/** What markdown nested deeper is, as a field's validation message (`markdown: …`). */
export const MARKDOWN_NESTING = `is nested deeper than ${MAX_MARKDOWN_NESTING} levels (block quotes and lists)`;
const MARKDOWN_TOO_DEEP = `markdown ${MARKDOWN_NESTING}`;
// The container markers a line opens with: `>`, and list markers followed by a blank or the end.
const MARKDOWN_CONTAINERS = /^(?:[ \t]*(?:>|[-+*](?=[ \t]|$)|\d{1,9}[.)](?=[ \t]|$)))+/;
const MARKDOWN_MARKER = /([ \t]*)(?:>|[-+*]|\d{1,9}[.)])/g;

/**
 * Whether a line of markdown opens more than MAX_MARKDOWN_NESTING block quotes and lists: the
 * markers it starts with, plus the indentation before and between them in list levels (two
 * columns each, past the one blank a marker takes: a nested list is indented under its parent,
 * also inside a quote). Conservative: a level it counts may be none.
 */
export function markdownNestedTooDeep(markdown: string): boolean {
  for (let start = 0; start < markdown.length; ) {
    let end = markdown.indexOf('\n', start);
    if (end === -1) end = markdown.length;
    const line = markdown.slice(start, end);
    start = end + 1;
    const run = MARKDOWN_CONTAINERS.exec(line)?.[0];
    if (!run) continue;
    let depth = 0;
    for (const [, blanks] of run.matchAll(MARKDOWN_MARKER)) {
      const columns = blanks!.replace(/\t/g, '    ').length;
      depth += 1 + Math.floor((depth === 0 ? columns : Math.max(0, columns - 1)) / 2);
    }
    if (depth > MAX_MARKDOWN_NESTING) return true;
  }
  return false;
}

export function markdownToHtml(markdown: string): string {
  if (markdownNestedTooDeep(markdown)) throw new ContentTooDeepError(MARKDOWN_TOO_DEEP);
  try {
    return marked.parse(markdown, { async: false });
  } catch (error) {
    // A nesting the line check did not see: the parser's stack, not its own words.
    if (error instanceof Error && /Maximum call stack size exceeded/.test(error.message)) throw new ContentTooDeepError(MARKDOWN_TOO_DEEP);
    throw error;
  }
}

export function tiptapToHtml(doc: JSONContent): string {
  return renderToHTMLString({ extensions: TIPTAP_EXTENSIONS, content: doc });
}

// The email-safe styles of generated bodies, inlined on each element (mail clients drop
// <style> blocks). Markdown and tiptap output is a known, small set of tags, so the styles
// are set while wrapping instead of re-parsing the HTML with juice: that parse cost more
// than the rest of a send. A tag that already has a style (raw HTML in markdown) is kept.
const FONT = "-apple-system, BlinkMacSystemFont, 'Segoe UI', Helvetica, Arial, sans-serif";
const HEADING = `font-family: ${FONT}; color: #18181b; margin: 0 0 16px; line-height: 1.25;`;
const TAG_STYLES: Record<string, string> = {
  h1: `${HEADING} font-size: 28px;`,
  h2: `${HEADING} font-size: 22px;`,
  h3: `${HEADING} font-size: 18px;`,
  h4: `${HEADING} font-size: 16px;`,
  p: 'margin: 0 0 16px;',
  a: 'color: #2563eb;',
  img: 'max-width: 100%; height: auto; border: 0;',
  blockquote: 'margin: 0 0 16px; padding-left: 16px; border-left: 4px solid #e4e4e7; color: #52525b;',
  pre: 'padding: 12px; background-color: #f4f4f5; overflow: auto; font-size: 14px;',
  code: 'font-family: Menlo, Consolas, monospace; font-size: 14px;',
  table: 'border-collapse: collapse; margin: 0 0 16px;',
  th: 'border: 1px solid #e4e4e7; padding: 6px 10px; text-align: left;',
  td: 'border: 1px solid #e4e4e7; padding: 6px 10px;',
  hr: 'border: 0; border-top: 1px solid #e4e4e7; margin: 24px 0;',
  ul: 'margin: 0 0 16px; padding-left: 24px;',
  ol: 'margin: 0 0 16px; padding-left: 24px;',
};
const STYLED_TAGS = new Set(Object.keys(TAG_STYLES));
const isTagEnd = (c: number) => c === 0x20 || c === 0x0a || c === 0x09 || c === 0x0c || c === 0x0d || c === 0x2f /* / */ || c === 0x3e; /* > */

/**
 * Adds the house style to each known opening tag that has no style of its own.
 *
 * A scan, not a regular expression: `<p` followed by anything up to the first `>` took time
 * in the square of the input when no `>` came (each `<p` searched to the end again). Here
 * the position of the next `>` is found once and reused by every tag before it, so a
 * document is read a bounded number of times whatever it holds.
 */
export function inlineStyles(html: string): string {
  let out = '';
  let from = 0;
  let nextGt = -1;
  let at = html.indexOf('<');
  while (at >= 0) {
    let end = at + 1;
    while (end < html.length && !isTagEnd(html.charCodeAt(end))) end++;
    const name = html.slice(at + 1, end).toLowerCase();
    if (end < html.length && STYLED_TAGS.has(name)) {
      if (nextGt < end) nextGt = html.indexOf('>', end);
      // No `>` after this tag: no later tag can be complete either.
      if (nextGt < 0) break;
      const selfClose = html.charCodeAt(nextGt - 1) === 0x2f && nextGt - 1 >= end;
      const attrs = html.slice(end, selfClose ? nextGt - 1 : nextGt);
      if (!/\sstyle\s*=/i.test(attrs)) {
        out += `${html.slice(from, at)}<${html.slice(at + 1, end)}${attrs} style="${TAG_STYLES[name]}"${selfClose ? '/' : ''}>`;
        from = nextGt + 1;
      }
      at = html.indexOf('<', nextGt + 1);
    } else {
      at = html.indexOf('<', end);
    }
  }
  return out + html.slice(from);
}

const BODY_STYLE = 'margin: 0; padding: 0; background-color: #f4f4f5;';
const CONTENT_STYLE = `padding: 32px; font-family: ${FONT}; font-size: 16px; line-height: 1.5; color: #18181b;`;

function preheader(preview: string | null | undefined): string {
  if (!preview) return '';
  // Hidden in the body, shown by inboxes next to the subject.
  return `<div class="preheader" style="display:none;max-height:0;overflow:hidden;mso-hide:all;font-size:1px;line-height:1px;color:#ffffff;opacity:0;">${escapeHtml(preview)}</div>`;
}

// Table-based, 600 px wide, system fonts: what renders alike in Outlook, Gmail and Apple Mail.
/** The email-safe layout around a generated body (campaign rendering uses it too). */
export function layout(bodyHtml: string, subject: string, preview: string | null | undefined): string {
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><meta name="x-apple-disable-message-reformatting"><title>${escapeHtml(subject)}</title></head>
<body style="${BODY_STYLE}">${preheader(preview)}<table role="presentation" width="100%" cellpadding="0" cellspacing="0" border="0" bgcolor="#f4f4f5" style="width: 100%; background-color: #f4f4f5;"><tr><td align="center">
<table role="presentation" width="600" cellpadding="0" cellspacing="0" border="0" bgcolor="#ffffff" style="width: 100%; max-width: 600px; margin: 0 auto; background-color: #ffffff;"><tr><td style="${CONTENT_STYLE}">${bodyHtml}</td></tr></table>
</td></tr></table></body></html>`;
}

/** Puts the preheader right after <body> of a complete HTML document given by the client. */
function withPreheader(html: string, preview: string | null | undefined): string {
  if (!preview) return html;
  // The first `<body` and the first `>` after it, each found once (`/<body[^>]*>/` searched
  // to the end again from every `<body` that had no `>` after it: quadratic).
  const body = html.search(/<body/i);
  const gt = body < 0 ? -1 : html.indexOf('>', body);
  if (gt < 0) return preheader(preview) + html;
  return html.slice(0, gt + 1) + preheader(preview) + html.slice(gt + 1);
}

const TEXT_SELECTORS = [
  { selector: 'div.preheader', format: 'skip' },
  { selector: 'img', format: 'skip' },
  { selector: 'a', options: { hideLinkHrefIfSameAsText: true } },
  { selector: 'h1', options: { uppercase: false } },
  { selector: 'h2', options: { uppercase: false } },
  { selector: 'h3', options: { uppercase: false } },
];
// Client HTML: tables are most often layout, read as lines: each row and each cell a block of
// its own. The library's default runs a table's cells together as one inline run, which costs
// the square of the table's size (a 16,000-row table took 12 s, a 1 MiB one minutes) and
// glues neighbouring cells' words; blocks cost a table's size.
const LINES = { leadingLineBreaks: 1, trailingLineBreaks: 1 };
const TABLES_AS_LINES = ['table', 'tr', 'td', 'th'].map((selector) => ({ selector, format: 'block', options: LINES }));
const htmlToText = compile({ wordwrap: 78, selectors: [...TEXT_SELECTORS, ...TABLES_AS_LINES] });
// A generated body: a table is a GFM data table, laid out in columns, up to MAX_DATA_TABLE_CELLS
// cells in the body (the column layout is superlinear too: 250,000 columns took minutes); a
// body with more is read as lines.
const bodyToText = compile({ wordwrap: 78, selectors: [...TEXT_SELECTORS, { selector: 'table', format: 'dataTable' }] });
const MAX_DATA_TABLE_CELLS = 2_000;

function generatedText(body: string): string {
  let cells = 0;
  for (let at = body.indexOf('<t'); at !== -1 && cells <= MAX_DATA_TABLE_CELLS; at = body.indexOf('<t', at + 2)) {
    const tag = body[at + 2];
    if ((tag === 'd' || tag === 'h') && /[\s>]/.test(body[at + 3] ?? '')) cells++;
  }
  return cells > MAX_DATA_TABLE_CELLS ? htmlToText(body) : bodyToText(body);
}

export interface RenderInput {
  contentKind: ContentKind;
  /** HTML or markdown, or the tiptap document as JSON text. */
  content: string;
  subject: string;
  preview?: string | null;
  text?: string | null;
}

export interface Rendered {
  html: string;
  text: string;
}

/**
 * juice matches every selector of the `<style>` blocks against every element: its time is
 * their product (4,000 rules and 4,000 elements, 80 KB, took two minutes). Past this many
 * pairs (about a quarter of a second) the styles are left in their `<style>` block, as sent:
 * Gmail, Apple Mail and Outlook apply it; only clients that ignore `<style>` lose them.
 * A newsletter of 60 rules and 800 elements is half of it.
 */
export const INLINING_BUDGET = 100_000;

/** Selectors in the `<style>` blocks (a comma or a rule's brace each, at most) times the elements. */
export function inliningCost(html: string): number {
  // One pass each, by indexOf: a regular expression over blocks that never close would scan
  // the rest of the text once per `<style`.
  const lower = html.toLowerCase();
  let selectors = 0;
  for (let open = lower.indexOf('<style'); open !== -1; ) {
    const body = lower.indexOf('>', open);
    const close = body === -1 ? -1 : lower.indexOf('</style', body);
    if (close === -1) break;
    for (let i = body; i < close; i++) {
      const c = lower.charCodeAt(i);
      if (c === 0x7b /* { */ || c === 0x2c /* , */) selectors++;
    }
    open = lower.indexOf('<style', close);
  }
  let elements = 0;
  for (let i = lower.indexOf('<'); i !== -1; i = lower.indexOf('<', i + 1)) {
    const c = lower.charCodeAt(i + 1);
    if (c >= 0x61 && c <= 0x7a) elements++;
  }
  return selectors * elements;
}

/** Throws ContentTooLargeError when a content part is over MAX_CONTENT_CHARS. */
export function assertContentSize(...parts: Array<string | null | undefined>): void {
  for (const part of parts) if (part && part.length > MAX_CONTENT_CHARS) throw new ContentTooLargeError(part.length);
}

export function renderEmail(input: RenderInput): Rendered {
  assertContentSize(input.content, input.text);
  return renderChecked(input);
}

/** renderEmail for content whose source was already checked (a campaign's rendered layout). */
export function renderChecked(input: RenderInput): Rendered {
  if (input.contentKind === 'html') {
    if (nestedTooDeep(input.content)) throw new ContentTooDeepError();
    // The client's own HTML is kept as written: only the preheader is added and any <style>
    // block inlined (juice keeps media queries in the <style>).
    let html = withPreheader(input.content, input.preview);
    if (/<style[\s>]/i.test(html) && inliningCost(html) <= INLINING_BUDGET) html = juice(html);
    return { html, text: input.text ?? htmlToText(html) };
  }
  const body = input.contentKind === 'markdown' ? markdownToHtml(input.content) : tiptapToHtml(JSON.parse(input.content) as JSONContent);
  if (nestedTooDeep(body)) throw new ContentTooDeepError();
  // The text comes from the bare body: the layout and styles add no text, and parsing a
  // third of the HTML is a third of the cost.
  return { html: laidOut(body, input.subject, input.preview), text: input.text ?? generatedText(body) };
}

/** A generated body as every generated email is sent: its styles inlined, in the layout. */
export function laidOut(bodyHtml: string, subject: string, preview: string | null | undefined): string {
  return layout(inlineStyles(bodyHtml), subject, preview);
}

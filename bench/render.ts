/**
 * `npm run bench:render`: the rendering worst cases (docs/security.md). Bodies of unclosed
 * tags (`<p ` and `<body` repeated) through the linear scans of render.ts, against the
 * regular expressions they replace (the baseline, run in this same process), at a size the
 * baseline can still finish; then the linear scans alone at the maximum content size.
 */
import { inlineStyles, MAX_CONTENT_CHARS, renderEmail } from '../src/shared/emails/render.js';

// The former patterns, kept here only as the baseline.
const OLD_STYLED_TAG = /<(h1|h2|h3|h4|p|a|img|blockquote|pre|code|table|th|td|hr|ul|ol)(?=[\s>/])([^>]*?)(\/?)>/gi;
const oldInlineStyles = (html: string) => html.replace(OLD_STYLED_TAG, (whole) => whole);
const oldPreheader = (html: string) => /<body[^>]*>/i.exec(html);

function best(run: () => unknown, times = 3): number {
  let min = Infinity;
  for (let i = 0; i < times; i++) {
    const started = performance.now();
    run();
    min = Math.min(min, performance.now() - started);
  }
  return min;
}

const fill = (unit: string, chars: number) => unit.repeat(Math.floor(chars / unit.length));
const SMALL = 48_000;

const rows: string[] = [];
for (const [name, unit, oldFn, newFn] of [
  ['unclosed <p (inline styles)', '<p ', oldInlineStyles, inlineStyles],
  ['unclosed <body (preheader)', '<body', oldPreheader, (html: string) => renderEmail({ contentKind: 'html', content: html, subject: 's', preview: 'p', text: 't' })],
] as const) {
  // No `>` at all: each unclosed tag made the regular expression search to the end again.
  const small = fill(unit, SMALL);
  const before = best(() => oldFn(small));
  const after = best(() => newFn(small));
  const max = fill(unit, MAX_CONTENT_CHARS);
  const atMax = best(() => newFn(max));
  rows.push(`| ${name} | ${SMALL.toLocaleString('en')} | ${before.toFixed(1)} | ${after.toFixed(1)} | ${(before / after).toFixed(0)}x | ${atMax.toFixed(1)} |`);
}
const plain = fill('Hello *world*, here is [a link](https://example.com/x). ', MAX_CONTENT_CHARS);
const plainMs = best(() => renderEmail({ contentKind: 'markdown', content: plain, subject: 's' }), 1);

console.log('| worst case | chars | regex ms | scan ms | ratio | scan ms at 1 MiB |');
console.log('|---|---:|---:|---:|---:|---:|');
for (const row of rows) console.log(row);
console.log(`\nplain markdown of ${MAX_CONTENT_CHARS.toLocaleString('en')} chars, text part generated: ${plainMs.toFixed(0)} ms (linear; in a render thread when the API asks)`);

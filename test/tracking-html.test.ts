import { parse, type DefaultTreeAdapterMap } from 'parse5';
import { describe, expect, it } from 'vitest';
import { LinkSigner } from '../src/shared/crypto.js';
import { addTracking, scanTags } from '../src/shared/outcomes/tracking-html.js';

type Node = DefaultTreeAdapterMap['node'];

// What a full parse says: the href spans of <a>/<area> (once each, in source order) and
// the end of an explicit <body>.
function parsed(html: string) {
  const links: { start: number; end: number; url: string }[] = [];
  let bodyEnd: number | undefined;
  const visit = (node: Node): void => {
    if ('tagName' in node) {
      if (node.tagName === 'body') bodyEnd = node.sourceCodeLocation?.endTag?.startOffset;
      if (node.tagName === 'a' || node.tagName === 'area') {
        const href = node.attrs.find((a) => a.name === 'href' && !a.prefix);
        const at = node.sourceCodeLocation?.attrs?.href;
        if (href && at && !links.some((l) => l.start === at.startOffset)) links.push({ start: at.startOffset, end: at.endOffset, url: href.value });
      }
    }
    if ('childNodes' in node) for (const child of node.childNodes) visit(child);
    if ('content' in node && node.content) visit(node.content);
  };
  visit(parse(html, { sourceCodeLocationInfo: true }));
  return { links: links.sort((a, b) => a.start - b.start), bodyEnd };
}

const PIECES = [
  '<a href="https://x.test/a?b=1&amp;c=2">', '<a HREF=https://u.test/q>', "<a href='http://s.test/'>", '<a title=">" href="https://t.test/">',
  '<a href="x" href="https://dup.test">', '</a>', '<p>', '</p>', 'text', ' < ', '<!-- <a href="https://c.test"> -->', '<!---->', '<!-->',
  '<!DOCTYPE html>', '<![if !mso]>', '<![endif]>', '<?xml x?>', '<style> <a href="https://no.test"> </style>', '<title><a href="https://no.test"></title>',
  '<textarea><a href=https://no.test></textarea>', '<script>var a="<a href=https://no.test>"</script>', '<table>', '<tr><td>', '</td></tr>', '</table>',
  '</p foo=">">', '<area href="https://area.test" alt=x>', '<a/href="https://slash.test">', '<a href = "https://sp.test" >', '<a href=&quot;x>',
  '<a href="https://e.test/&#x41;&lt;">', '<noscript><a href="https://ns.test"></noscript>', '<template><a href="https://tp.test"></a></template>',
  '<a href>', '<a href=>', '<b>', '</b>', '<a\nhref="https://nl.test">', '\r\n', '</>', '</ body>', '<img src="a.png"/>',
];

describe('finding the links to track', () => {
  it('finds what a full parse finds, on generated documents', () => {
    let seed = 7;
    const random = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
    for (let n = 0; n < 3000; n++) {
      const body = Array.from({ length: 1 + Math.floor(random() * 20) }, () => PIECES[Math.floor(random() * PIECES.length)]).join('');
      const html = `<!DOCTYPE html><html><head><title>t</title></head><body>${body}</body></html>`;
      const scanned = scanTags(html);
      expect(scanned, html).toBeDefined();
      const reference = parsed(html);
      expect(scanned!.links, html).toEqual(reference.links);
      // The first </body> outside comments and raw text (a parse may move the body's end).
      if (!/<\/body|<template|<table/i.test(body)) expect(scanned!.bodyEnd, html).toBe(reference.bodyEnd);
    }
  });

  it('leaves SVG and escaped scripts to the parser', () => {
    expect(scanTags('<svg><a href="https://x.test"><![CDATA[>]]></a></svg>')).toBeUndefined();
    expect(scanTags('<script><!-- <script> </script> --></script>')).toBeUndefined();
  });

  it('rewrites a misnested link once', () => {
    const signer = new LinkSigner('a-secret-key-for-the-tracking-html-test-0123');
    const out = addTracking('<p><a href="https://x.test/">one<p>two</a>', { emailId: 'eml_1', trackOpens: false, trackClicks: true, publicUrl: 'https://m.test', signer });
    expect(out.match(/\/t\/c\//g)).toHaveLength(1);
    expect(out).toMatch(/^<p><a href="https:\/\/m\.test\/t\/c\/[^"]+">one<p>two<\/a>$/);
  });

  it('leaves a link no URL parser takes as it is', () => {
    const signer = new LinkSigner('a-secret-key-for-the-tracking-html-test-0123');
    const html = '<a href="https://[::1/x">broken</a> <a href="https://x.test/é">fine</a>';
    const out = addTracking(html, { emailId: 'eml_1', trackOpens: false, trackClicks: true, publicUrl: 'https://m.test', signer });
    expect(out).toContain('<a href="https://[::1/x">broken</a>');
    expect(out.match(/\/t\/c\//g)).toHaveLength(1);
  });
});

import { escapeHtml } from '../html.js';
import { isObject, safeUrl, UNSUBSCRIBE_TARGET } from './html.js';

/**
 * PLATE content: a Plate (Slate) value, an array of element nodes `{ type, children }` whose
 * leaves are text nodes `{ text, bold?, italic?, ... }`. No well-kept library renders Slate
 * JSON to email HTML on a server (Plate's own serializer needs React and the editor), so
 * this small renderer covers the nodes of Plate's basic plugins: p, h1-h6, blockquote,
 * code_block/code_line, ul/ol/li/lic (and the indent-list form: `listStyleType` on a
 * paragraph), a (`url`), img (`url`), hr, and the marks bold, italic, underline,
 * strikethrough, code, subscript, superscript. Unknown elements render their children.
 */
type Node = Record<string, unknown> & { type?: unknown; children?: unknown; text?: unknown };

export function plateNodes(content: unknown): unknown[] | undefined {
  if (Array.isArray(content)) return content;
  if (isObject(content) && Array.isArray(content.children)) return content.children;
  return undefined;
}

export function plateProblem(content: unknown): string | undefined {
  const nodes = plateNodes(content);
  if (!nodes) return 'must be a Plate value: an array of element nodes';
  for (const node of nodes) {
    const bad = findBad(node, 0);
    if (bad) return bad;
  }
  return undefined;
}

function findBad(node: unknown, depth: number): string | undefined {
  if (depth > 50) return 'is nested too deeply';
  if (!isObject(node)) return 'every node must be an object';
  if (typeof node.text === 'string') return undefined;
  if (!Array.isArray(node.children)) return 'an element node needs a "children" array (a text node needs a string "text")';
  if (node.type !== undefined && typeof node.type !== 'string') return '"type" must be a string';
  for (const child of node.children) {
    const bad = findBad(child, depth + 1);
    if (bad) return bad;
  }
  return undefined;
}

export function plateHasUnsubscribeLink(content: unknown): boolean {
  const walk = (node: unknown): boolean =>
    isObject(node) &&
    (((node.type === 'a' || node.type === 'link') && typeof node.url === 'string' && UNSUBSCRIBE_TARGET.test(node.url)) ||
      (Array.isArray(node.children) && node.children.some(walk)));
  return (plateNodes(content) ?? []).some(walk);
}

export function plateToHtml(content: unknown): string {
  const nodes = (plateNodes(content) ?? []) as Node[];
  let html = '';
  // Indent lists: consecutive paragraphs with listStyleType become one list.
  for (let i = 0; i < nodes.length; ) {
    const kind = listKind(nodes[i]!);
    if (!kind) {
      html += render(nodes[i]!);
      i++;
      continue;
    }
    let items = '';
    while (i < nodes.length && listKind(nodes[i]!) === kind) items += `<li>${inner(nodes[i++]!)}</li>`;
    html += `<${kind}>${items}</${kind}>`;
  }
  return html;
}

function listKind(node: Node): 'ul' | 'ol' | undefined {
  const style = node.listStyleType;
  if (typeof style !== 'string') return undefined;
  return /decimal|alpha|roman|number/i.test(style) ? 'ol' : 'ul';
}

function inner(node: Node): string {
  return Array.isArray(node.children) ? (node.children as Node[]).map(render).join('') : '';
}

function leaf(node: Node): string {
  let html = escapeHtml(String(node.text)).replace(/\n/g, '<br>');
  if (node.code) html = `<code>${html}</code>`;
  if (node.bold) html = `<strong>${html}</strong>`;
  if (node.italic) html = `<em>${html}</em>`;
  if (node.underline) html = `<u>${html}</u>`;
  if (node.strikethrough) html = `<s>${html}</s>`;
  if (node.subscript) html = `<sub>${html}</sub>`;
  if (node.superscript) html = `<sup>${html}</sup>`;
  return html;
}

function render(node: Node): string {
  if (typeof node.text === 'string') return leaf(node);
  const align = typeof node.align === 'string' && /^(left|center|right|justify)$/.test(node.align) ? ` style="text-align: ${node.align};"` : '';
  switch (node.type) {
    case 'p':
    case 'paragraph':
      return `<p${align}>${inner(node) || '&nbsp;'}</p>`;
    case 'h1':
    case 'h2':
    case 'h3':
    case 'h4':
    case 'h5':
    case 'h6':
      return `<${node.type}${align}>${inner(node)}</${node.type}>`;
    case 'blockquote':
      return `<blockquote>${inner(node)}</blockquote>`;
    case 'code_block':
      return `<pre><code>${(node.children as Node[]).map((l) => (typeof l.text === 'string' ? escapeHtml(l.text) : Array.isArray(l.children) ? (l.children as Node[]).map((t) => escapeHtml(String(t.text ?? ''))).join('') : '')).join('\n')}</code></pre>`;
    case 'code_line':
      return inner(node);
    case 'ul':
    case 'ol':
      return `<${node.type}>${inner(node)}</${node.type}>`;
    case 'li':
      return `<li>${inner(node)}</li>`;
    case 'lic':
      return inner(node);
    case 'a':
    case 'link':
      return `<a href="${escapeHtml(safeUrl(node.url))}" target="_blank">${inner(node)}</a>`;
    case 'img':
    case 'image': {
      const src = safeUrl(node.url);
      const width = typeof node.width === 'number' ? ` width="${Math.round(node.width)}"` : '';
      return src ? `<p${align}><img src="${escapeHtml(src)}" alt="${escapeHtml(String(node.alt ?? node.caption ?? ''))}"${width}></p>` : '';
    }
    case 'hr':
      return '<hr>';
    default:
      return inner(node);
  }
}

import { escapeHtml } from '../html.js';
import { isObject, safeUrl, UNSUBSCRIBE_TARGET } from './html.js';

/**
 * MAILY content: the Maily editor's tiptap (ProseMirror) JSON. `@maily-to/render` renders it
 * through React Email; we render the same node types directly to email-safe HTML instead
 * (no React in the workers, one pass per campaign). Supported nodes: doc, paragraph, heading,
 * text (marks bold, italic, underline, strike, code, link, textStyle color), bulletList,
 * orderedList, listItem, blockquote, codeBlock, horizontalRule, hardBreak, image,
 * inlineImage, logo, button, linkCard, spacer, section, columns/column, footer, variable,
 * repeat/show (their content is rendered), htmlCodeBlock (as escaped code). Unknown nodes
 * render their children.
 */
type Node = { type?: unknown; attrs?: Record<string, unknown>; content?: unknown; text?: unknown; marks?: unknown };

const ALIGN = new Set(['left', 'center', 'right']);
const align = (a: unknown) => (typeof a === 'string' && ALIGN.has(a) ? a : 'left');
const color = (c: unknown, fallback: string) => (typeof c === 'string' && /^#[0-9a-f]{3,8}$|^rgba?\([\d\s,.%]+\)$/i.test(c) ? c : fallback);
const num = (n: unknown, fallback: number) => (typeof n === 'number' && Number.isFinite(n) ? n : typeof n === 'string' && /^\d+(\.\d+)?$/.test(n) ? Number(n) : fallback);

export function mailyProblem(doc: unknown): string | undefined {
  if (!isObject(doc)) return 'must be a Maily (tiptap) JSON document: an object';
  if (doc.type !== 'doc') return 'must be a Maily document whose root type is "doc"';
  if (doc.content !== undefined && !Array.isArray(doc.content)) return 'content of the doc must be an array';
  const bad = findBad(doc, 0);
  return bad;
}

function findBad(node: unknown, depth: number): string | undefined {
  if (depth > 50) return 'is nested too deeply';
  if (!isObject(node) || typeof node.type !== 'string') return 'every node must be an object with a string "type"';
  if (node.type === 'text' && typeof node.text !== 'string') return 'a text node needs a string "text"';
  if (node.content !== undefined) {
    if (!Array.isArray(node.content)) return `content of a ${node.type} node must be an array`;
    for (const child of node.content) {
      const bad = findBad(child, depth + 1);
      if (bad) return bad;
    }
  }
  return undefined;
}

export function mailyHasUnsubscribeLink(node: unknown): boolean {
  if (!isObject(node)) return false;
  const attrs = isObject(node.attrs) ? node.attrs : {};
  if ((node.type === 'button' || node.type === 'linkCard') && [attrs.url, attrs.href, attrs.link].some((v) => typeof v === 'string' && UNSUBSCRIBE_TARGET.test(v))) return true;
  if ((node.type === 'image' || node.type === 'logo') && typeof attrs.externalLink === 'string' && UNSUBSCRIBE_TARGET.test(attrs.externalLink)) return true;
  if (Array.isArray(node.marks)) {
    for (const m of node.marks) if (isObject(m) && m.type === 'link' && isObject(m.attrs) && typeof m.attrs.href === 'string' && UNSUBSCRIBE_TARGET.test(m.attrs.href)) return true;
  }
  return Array.isArray(node.content) && node.content.some(mailyHasUnsubscribeLink);
}

export function mailyToHtml(doc: unknown): string {
  return children(doc as Node);
}

function children(node: Node): string {
  return Array.isArray(node.content) ? node.content.map((c) => render(c as Node)).join('') : '';
}

function text(node: Node): string {
  let html = escapeHtml(String(node.text ?? ''));
  const marks = Array.isArray(node.marks) ? (node.marks as Node[]) : [];
  for (const mark of marks) {
    const a = mark.attrs ?? {};
    switch (mark.type) {
      case 'bold':
        html = `<strong>${html}</strong>`;
        break;
      case 'italic':
        html = `<em>${html}</em>`;
        break;
      case 'underline':
        html = `<u>${html}</u>`;
        break;
      case 'strike':
        html = `<s>${html}</s>`;
        break;
      case 'code':
        html = `<code>${html}</code>`;
        break;
      case 'textStyle':
        if (a.color) html = `<span style="color: ${color(a.color, 'inherit')};">${html}</span>`;
        break;
      case 'link':
        html = `<a href="${escapeHtml(safeUrl(a.href))}" target="_blank">${html}</a>`;
        break;
    }
  }
  return html;
}

function render(node: Node): string {
  const a = node.attrs ?? {};
  switch (node.type) {
    case 'text':
      return text(node);
    case 'variable': {
      const id = typeof a.id === 'string' && /^[A-Za-z0-9_.-]+$/.test(a.id) ? a.id : '';
      // Maily's variable carries its own fallback: the merge tag's `|fallback` (personalize.ts).
      const fallback = typeof a.fallback === 'string' ? escapeHtml(a.fallback.replace(/[{}|%]/g, '').slice(0, 200)) : '';
      return id ? `{{${id}${fallback ? `|${fallback}` : ''}}}` : '';
    }
    case 'paragraph':
      return `<p style="text-align: ${align(a.textAlign)};">${children(node) || '&nbsp;'}</p>`;
    case 'footer':
      return `<p style="text-align: ${align(a.textAlign)}; font-size: 13px; color: #64748b;">${children(node)}</p>`;
    case 'heading': {
      const level = Math.min(6, Math.max(1, num(a.level, 1)));
      return `<h${level} style="text-align: ${align(a.textAlign)};">${children(node)}</h${level}>`;
    }
    case 'bulletList':
      return `<ul>${children(node)}</ul>`;
    case 'orderedList':
      return `<ol start="${num(a.start, 1)}">${children(node)}</ol>`;
    case 'listItem':
      return `<li>${children(node).replace(/^<p style="[^"]*">([\s\S]*)<\/p>$/, '$1')}</li>`;
    case 'blockquote':
      return `<blockquote>${children(node)}</blockquote>`;
    case 'codeBlock':
    case 'htmlCodeBlock':
      return `<pre><code>${children(node)}</code></pre>`;
    case 'horizontalRule':
      return '<hr>';
    case 'hardBreak':
      return '<br>';
    case 'spacer':
      return `<div style="height: ${num(a.height, 16)}px; line-height: ${num(a.height, 16)}px;">&nbsp;</div>`;
    case 'image':
    case 'inlineImage':
    case 'logo': {
      const src = safeUrl(a.src);
      if (!src) return '';
      const width = node.type === 'logo' ? ({ sm: 40, md: 48, lg: 64 } as Record<string, number>)[String(a.size)] ?? 48 : num(a.width, 0);
      const img = `<img src="${escapeHtml(src)}" alt="${escapeHtml(String(a.alt ?? ''))}"${width ? ` width="${width}"` : ''}>`;
      const href = safeUrl(a.externalLink);
      const linked = href ? `<a href="${escapeHtml(href)}" target="_blank">${img}</a>` : img;
      return node.type === 'inlineImage' ? linked : `<div style="text-align: ${align(a.alignment)}; margin: 0 0 16px;">${linked}</div>`;
    }
    case 'button': {
      const href = safeUrl(a.url ?? a.href);
      const bg = color(a.buttonColor, '#000000');
      const fg = color(a.textColor, '#ffffff');
      const radius = a.borderRadius === 'sharp' ? 0 : a.borderRadius === 'round' ? 9999 : 6;
      const outline = a.variant === 'outline';
      const style = `display: inline-block; padding: 12px 24px; border-radius: ${radius}px; text-decoration: none; font-weight: 600; ${
        outline ? `border: 2px solid ${bg}; color: ${bg}; background-color: transparent;` : `background-color: ${bg}; color: ${fg};`
      }`;
      return `<div style="text-align: ${align(a.alignment)}; margin: 0 0 16px;"><a href="${escapeHtml(href)}" target="_blank" style="${style}">${escapeHtml(String(a.text ?? ''))}</a></div>`;
    }
    case 'linkCard': {
      const href = safeUrl(a.link);
      return `<div style="border: 1px solid #e4e4e7; border-radius: 8px; padding: 16px; margin: 0 0 16px;"><a href="${escapeHtml(href)}" target="_blank"><strong>${escapeHtml(String(a.title ?? ''))}</strong></a><p style="margin: 8px 0 0;">${escapeHtml(String(a.description ?? ''))}</p></div>`;
    }
    case 'section':
      return `<table role="presentation" width="100%" cellpadding="0" cellspacing="0" border="0" style="margin: 0 0 16px; border-radius: ${num(a.borderRadius, 0)}px; background-color: ${color(a.backgroundColor, 'transparent')};"><tr><td style="padding: ${num(a.paddingTop, 5)}px ${num(a.paddingRight, 5)}px ${num(a.paddingBottom, 5)}px ${num(a.paddingLeft, 5)}px; text-align: ${align(a.align)};">${children(node)}</td></tr></table>`;
    case 'columns':
      return `<table role="presentation" width="100%" cellpadding="0" cellspacing="0" border="0" style="margin: 0 0 16px;"><tr>${children(node)}</tr></table>`;
    case 'column': {
      const width = a.width === 'auto' || a.width === undefined ? '' : ` width="${num(a.width, 0)}%"`;
      return `<td valign="top"${width} style="vertical-align: top;">${children(node)}</td>`;
    }
    default:
      return children(node);
  }
}

import { parse, type DefaultTreeAdapterMap } from 'parse5';
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

const escapeAttribute = (value: string) => value.replace(/&/g, '&amp;').replace(/"/g, '&quot;');

/**
 * The HTML handed to the transport: the stored body (which stays without tracking,
 * contract 9) with its http(s) links rewritten to `/t/c/{token}` and a 1x1 pixel
 * `/t/o/{token}.gif` before `</body>`.
 *
 * parse5 gives the source offsets of every attribute, so only the `href` values change and
 * the rest of the document is kept byte for byte (no re-serialisation). Not rewritten:
 * `mailto:`, `tel:`, anchors, relative or templated links (`{{unsubscribe_url}}`), and the
 * service's own unsubscribe (`/u/`) and tracking links.
 */
export function addTracking(html: string, options: TrackingOptions): string {
  if (!options.trackOpens && !options.trackClicks) return html;
  const document = parse(html, { sourceCodeLocationInfo: true });
  const edits: { start: number; end: number; text: string }[] = [];
  let index = 0;
  let bodyEnd: number | undefined;

  const visit = (node: Node): void => {
    if ('tagName' in node) {
      const element = node as Element;
      if (element.tagName === 'body') bodyEnd = element.sourceCodeLocation?.endTag?.startOffset;
      if (options.trackClicks && (element.tagName === 'a' || element.tagName === 'area')) {
        const href = element.attrs.find((a) => a.name === 'href' && !a.prefix);
        const location = element.sourceCodeLocation?.attrs?.href;
        const url = href?.value.trim();
        if (url && location && isTrackable(url, options.publicUrl)) {
          const token = clickToken(options.signer, options.emailId, index++, url);
          edits.push({ start: location.startOffset, end: location.endOffset, text: `href="${escapeAttribute(`${options.publicUrl}/t/c/${token}`)}"` });
        }
      }
    }
    if ('childNodes' in node) for (const child of node.childNodes) visit(child);
    // <template> content is a fragment of its own.
    if ('content' in node && node.content) visit(node.content);
  };
  visit(document);

  if (options.trackOpens) {
    const src = `${options.publicUrl}/t/o/${openToken(options.signer, options.emailId)}.gif`;
    const pixel = `<img src="${escapeAttribute(src)}" width="1" height="1" alt="" style="display:block;width:1px;height:1px;border:0;margin:0;padding:0">`;
    const at = bodyEnd ?? html.length;
    edits.push({ start: at, end: at, text: pixel });
  }

  let out = html;
  for (const edit of edits.sort((a, b) => b.start - a.start)) out = out.slice(0, edit.start) + edit.text + out.slice(edit.end);
  return out;
}

function isTrackable(url: string, publicUrl: string): boolean {
  if (!/^https?:\/\//i.test(url)) return false;
  // Whitespace or control characters would not survive a Location header: left as they are.
  if (/[\s\u0000-\u001f\u007f]/.test(url)) return false;
  if (url.includes('{{') || url.includes('%7B%7B')) return false;
  const own = publicUrl.toLowerCase();
  const lower = url.toLowerCase();
  if (lower.startsWith(`${own}/u/`) || lower.startsWith(`${own}/t/`)) return false;
  return true;
}

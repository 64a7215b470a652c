import type { LinkSigner } from '../crypto.js';

/**
 * Tracking tokens (docs/outcomes.md "Tokens"), signed with SECRET_KEY through LinkSigner under a
 * purpose of their own, so an unsubscribe or confirmation token is never a tracking token.
 *
 * - open:  the email id;
 * - click: `<email id> <link index> <url>`: the original URL travels inside the signed
 *   token, so the redirect needs no database read and an altered URL fails the MAC.
 */
const OPEN = 'track-open';
const CLICK = 'track-click';

export function openToken(signer: LinkSigner, emailId: string): string {
  return signer.sign(OPEN, emailId);
}

export function clickToken(signer: LinkSigner, emailId: string, index: number, url: string): string {
  return signer.sign(CLICK, `${emailId} ${index} ${url}`);
}

export function readOpenToken(signer: LinkSigner, token: string): { emailId: string } | null {
  const emailId = signer.verify(OPEN, token);
  return emailId && /^eml_\w+$/.test(emailId) ? { emailId } : null;
}

export function readClickToken(signer: LinkSigner, token: string): { emailId: string; index: number; url: string } | null {
  const value = signer.verify(CLICK, token);
  if (!value) return null;
  const match = /^(eml_\w+) (\d{1,6}) (https?:\/\/\S+)$/i.exec(value);
  if (!match) return null;
  return { emailId: match[1]!, index: Number(match[2]), url: match[3]! };
}

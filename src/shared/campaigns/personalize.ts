import type { LinkSigner } from '../crypto.js';
import { escapeHtml } from '../html.js';

/**
 * Personalisation (docs/campaigns.md "Personalisation and unsubscribe"): `{{email}}`, `{{name}}`,
 * `{{fields.NAME}}` and `{{unsubscribe_url}}` (the built-in names in any case). Values are HTML-escaped in the HTML part, raw in the
 * text part and the subject (a header, never HTML; CR/LF removed). An unknown name renders empty.
 * The markdown renderer percent-encodes braces in link targets, so `%7B%7B...%7D%7D` counts too.
 *
 * A fallback follows a `|`: `Hello {{name|there}}` renders "Hello there" for a subscriber
 * without a name (empty or unknown value). It is template text, up to 200 characters (a %XX
 * escape counting as one) without `{`, `}`, `|` or a `%` that starts no escape (in a link
 * target the renderer encoded: `%7B%7Bfields.city%7Cnone%7D%7D`, its other %XX escapes kept as
 * they are, right for a URL), trimmed. The pattern stays linear: the
 * fallback's class excludes the braces and the bar, encoded or not, and its length is bounded,
 * so a failed match backtracks at most 200 steps.
 */
const PLACEHOLDER = /(?:\{\{|%7B%7B)\s*([A-Za-z0-9_.-]+)\s*(?:(?:\||%7C)((?:[^{}|%]|%(?!7[BCD])[0-9A-F]{2}){0,200}))?(?:\}\}|%7D%7D)/gi;

export const UNSUBSCRIBE_PURPOSE = 'unsubscribe';

export interface Recipient {
  id: string;
  email: string;
  name: string | null;
  fields: Record<string, string> | null;
}

/** Signs the subscriber id only: Fastify caps a path parameter at 100 characters. */
export function unsubscribeToken(signer: LinkSigner, subscriberId: string): string {
  return signer.sign(UNSUBSCRIBE_PURPOSE, subscriberId);
}

/** The unsubscribe token of a test send (`/u/test`): no subscriber, a page that says so. */
export const TEST_UNSUBSCRIBE_TOKEN = 'test';

export function unsubscribeUrl(publicUrl: string, token: string): string {
  return `${publicUrl.replace(/\/+$/, '')}/u/${token}`;
}

/**
 * The value of a placeholder's name for one recipient. The built-in names are read in any case
 * (`{{Name}}`, `{{UNSUBSCRIBE_URL}}`: the send check finds the unsubscribe link in any case, so
 * the link it found must be filled), a field's name as it is stored.
 */
export function variablesOf(recipient: Recipient, unsubscribe: string): (name: string) => string {
  return (name) => {
    const lower = name.toLowerCase();
    if (lower === 'email') return recipient.email;
    if (lower === 'name') return recipient.name ?? '';
    if (lower === 'unsubscribe_url') return unsubscribe;
    if (lower.startsWith('fields.')) {
      const value = recipient.fields?.[name.slice('fields.'.length)];
      return typeof value === 'string' ? value : value === undefined || value === null ? '' : String(value);
    }
    return '';
  };
}

// The fallback is template text: already HTML in the HTML part, as written in the others.
export function fillHtml(template: string, lookup: (name: string) => string): string {
  return template.replace(PLACEHOLDER, (_m, name: string, fallback: string | undefined) => {
    const value = lookup(name);
    return value === '' && fallback !== undefined ? fallback.trim() : escapeHtml(value);
  });
}

export function fillText(template: string, lookup: (name: string) => string): string {
  return template.replace(PLACEHOLDER, (_m, name: string, fallback: string | undefined) => {
    const value = lookup(name);
    return value === '' && fallback !== undefined ? fallback.trim() : value;
  });
}

export function fillSubject(template: string, lookup: (name: string) => string): string {
  return fillText(template, lookup).replace(/[\r\n]+/g, ' ');
}

/** What the send path reads to personalise a campaign email (content kind `campaign`). */
export interface CampaignEmailParts {
  subscriber_id: string | null;
  to_address: string;
  /** Null when the campaign (and its template) was deleted. */
  template_subject: string | null;
  template_html: string | null;
  template_text: string | null;
  /** Null when the subscriber was deleted. */
  subscriber_name: string | null;
  subscriber_fields: Record<string, string> | null;
}

export interface PersonalizedEmail {
  subject: string;
  html: string;
  text: string;
  headers: Record<string, string>;
}

/**
 * One recipient's message from the campaign's template, filled when the email is claimed
 * (the fan-out writes only the row). `{{email}}` is the address the row was written to.
 */
export function personalizeCampaignEmail(parts: CampaignEmailParts, deps: { signer: LinkSigner; publicUrl: string }): PersonalizedEmail {
  if (parts.template_html === null || parts.template_subject === null || parts.subscriber_id === null) throw new Error('the campaign template is gone (campaign deleted)');
  const url = unsubscribeUrl(deps.publicUrl, unsubscribeToken(deps.signer, parts.subscriber_id));
  const lookup = variablesOf({ id: parts.subscriber_id, email: parts.to_address, name: parts.subscriber_name, fields: parts.subscriber_fields }, url);
  return {
    subject: fillSubject(parts.template_subject, lookup),
    html: fillHtml(parts.template_html, lookup),
    text: fillText(parts.template_text ?? '', lookup),
    headers: unsubscribeHeaders(url),
  };
}

/** RFC 8058 one-click: a POST to this URL with List-Unsubscribe=One-Click unsubscribes. */
export function unsubscribeHeaders(url: string): Record<string, string> {
  return { 'List-Unsubscribe': `<${url}>`, 'List-Unsubscribe-Post': 'List-Unsubscribe=One-Click' };
}

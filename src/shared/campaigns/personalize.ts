import type { LinkSigner } from '../crypto.js';
import { escapeHtml } from './html.js';

/**
 * Personalisation (contract 8): `{{email}}`, `{{name}}`, `{{fields.NAME}}` and
 * `{{unsubscribe_url}}`. Values are HTML-escaped in the HTML part, raw in the text part and
 * the subject (a header, never HTML; CR/LF removed). An unknown name renders empty. The
 * markdown renderer percent-encodes braces in link targets, so `%7B%7B...%7D%7D` counts too.
 */
const PLACEHOLDER = /(?:\{\{|%7B%7B)\s*([A-Za-z0-9_.-]+)\s*(?:\}\}|%7D%7D)/gi;

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

export function unsubscribeUrl(publicUrl: string, token: string): string {
  return `${publicUrl.replace(/\/+$/, '')}/u/${token}`;
}

export function variablesOf(recipient: Recipient, unsubscribe: string): (name: string) => string {
  return (name) => {
    if (name === 'email') return recipient.email;
    if (name === 'name') return recipient.name ?? '';
    if (name === 'unsubscribe_url') return unsubscribe;
    if (name.startsWith('fields.')) {
      const value = recipient.fields?.[name.slice('fields.'.length)];
      return typeof value === 'string' ? value : value === undefined || value === null ? '' : String(value);
    }
    return '';
  };
}

export function fillHtml(template: string, lookup: (name: string) => string): string {
  return template.replace(PLACEHOLDER, (_m, name: string) => escapeHtml(lookup(name)));
}

export function fillText(template: string, lookup: (name: string) => string): string {
  return template.replace(PLACEHOLDER, (_m, name: string) => lookup(name));
}

export function fillSubject(template: string, lookup: (name: string) => string): string {
  return fillText(template, lookup).replace(/[\r\n]+/g, ' ');
}

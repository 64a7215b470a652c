import { safeEqual, sha256Hex } from '../crypto.js';
import type { DeliveryFeedback } from '../outcomes/provider-events.js';

/**
 * Postmark's webhooks (docs/outcomes.md): authenticated by HTTP basic auth with the user and
 * password set in the webhook's URL in Postmark's console. Bounce (HardBounce = hard, every
 * other type soft), SpamComplaint, Delivery. Postmark identifies the message by its own
 * `MessageID`, the id its SMTP server gave at hand-over.
 */
export function postmarkAuthorized(header: string | undefined, expected: { user: string; password: string }): boolean {
  const match = header ? /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header) : null;
  if (!match) return false;
  const decoded = Buffer.from(match[1]!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 0) return false;
  // Both compared, in constant time and whatever the first answer, as digests: comparing the
  // values themselves would tell their length.
  const userOk = safeEqual(sha256Hex(decoded.slice(0, colon)), sha256Hex(expected.user));
  const passwordOk = safeEqual(sha256Hex(decoded.slice(colon + 1)), sha256Hex(expected.password));
  return userOk && passwordOk;
}

interface PostmarkEvent {
  RecordType?: string;
  Type?: string;
  MessageID?: string;
  Details?: string;
  Description?: string;
  Headers?: { Name?: string; Value?: string }[];
}

export function postmarkFeedback(body: unknown): DeliveryFeedback[] {
  if (!body || typeof body !== 'object' || Array.isArray(body)) return [];
  const event = body as PostmarkEvent;
  const messageId = event.Headers?.find((h) => h.Name?.toLowerCase() === 'message-id')?.Value;
  const match = { messageId, providerMessageId: typeof event.MessageID === 'string' ? event.MessageID : undefined };
  switch (event.RecordType) {
    case 'Bounce':
      return [{ type: 'bounced', ...match, bounceType: event.Type === 'HardBounce' ? 'hard' : 'soft', diagnostic: event.Details || event.Description }];
    case 'SpamComplaint':
      return [{ type: 'complained', ...match }];
    case 'Delivery':
      return [{ type: 'delivered', ...match, diagnostic: event.Details }];
    default:
      return [];
  }
}

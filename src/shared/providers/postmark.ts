import { safeEqual, sha256Hex } from '../crypto.js';
import type { DeliveryFeedback } from '../outcomes/provider-events.js';

/**
 * Postmark's webhooks (docs/outcomes.md): authenticated by HTTP basic auth with the user and
 * password set in the webhook's URL in Postmark's console. Record types read: Bounce (by its
 * Type: HardBounce and BadEmailAddress hard; SpamComplaint a complaint; AutoResponder, Subscribe,
 * Unsubscribe, ChallengeVerification, AddressChange and OpenRelayTest no failure, ignored; any
 * other soft), SpamComplaint and Delivery. Postmark identifies the message by its own
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
  /** The recipient a Bounce or SpamComplaint is about. */
  Email?: string;
  /** The recipient of a Delivery. */
  Recipient?: string;
  Type?: string;
  MessageID?: string;
  Details?: string;
  Description?: string;
  Headers?: { Name?: string; Value?: string }[];
}

// Postmark's bounce types (its Bounce API): the permanent failures of the address are hard;
// the answers that are no failure at all (an auto-reply, a list's subscribe or unsubscribe
// notice, a challenge to verify the sender, an address change) are not bounces; the rest soft.
const HARD: readonly string[] = ['HardBounce', 'BadEmailAddress'];
const NOT_FAILURES: readonly string[] = ['AutoResponder', 'Subscribe', 'Unsubscribe', 'ChallengeVerification', 'AddressChange', 'OpenRelayTest'];

export function postmarkFeedback(body: unknown): DeliveryFeedback[] {
  if (!body || typeof body !== 'object' || Array.isArray(body)) return [];
  const event = body as PostmarkEvent;
  const messageId = event.Headers?.find((h) => h.Name?.toLowerCase() === 'message-id')?.Value;
  const recipient = event.RecordType === 'Delivery' ? event.Recipient : event.Email;
  const match = {
    messageId,
    providerMessageId: typeof event.MessageID === 'string' ? event.MessageID : undefined,
    ...(typeof recipient === 'string' ? { recipient } : {}),
  };
  switch (event.RecordType) {
    case 'Bounce': {
      // Not a failure: an out-of-office or list answer proves the message arrived.
      if (event.Type && NOT_FAILURES.includes(event.Type)) return [];
      if (event.Type === 'SpamComplaint') return [{ type: 'complained', ...match }];
      return [{ type: 'bounced', ...match, bounceType: event.Type && HARD.includes(event.Type) ? 'hard' : 'soft', diagnostic: event.Details || event.Description }];
    }
    case 'SpamComplaint':
      return [{ type: 'complained', ...match }];
    case 'Delivery':
      return [{ type: 'delivered', ...match, diagnostic: event.Details }];
    default:
      return [];
  }
}

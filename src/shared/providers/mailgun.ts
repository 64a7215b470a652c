import { createHmac } from 'node:crypto';
import { safeEqual } from '../crypto.js';
import type { DeliveryFeedback } from '../outcomes/provider-events.js';

/**
 * Mailgun's webhooks (docs/outcomes.md): the body carries `signature { timestamp, token,
 * signature }`, the signature being the hex HMAC-SHA256 of `timestamp + token` under the
 * webhook signing key. A timestamp more than 10 minutes away from now is refused (a replay).
 * Events read: delivered, failed (severity permanent = hard, temporary = soft), complained.
 */
export const MAILGUN_MAX_SKEW_MS = 10 * 60 * 1000;

export type MailgunCheck = { ok: true } | { ok: false; reason: string };

export function verifyMailgun(body: unknown, signingKey: string, now: Date): MailgunCheck {
  const signature = (body as { signature?: { timestamp?: unknown; token?: unknown; signature?: unknown } } | null)?.signature;
  const { timestamp, token, signature: hex } = signature ?? {};
  if (typeof timestamp !== 'string' && typeof timestamp !== 'number') return { ok: false, reason: 'no signature.timestamp' };
  if (typeof token !== 'string' || typeof hex !== 'string') return { ok: false, reason: 'no signature.token or signature.signature' };
  const expected = createHmac('sha256', signingKey).update(`${timestamp}${token}`).digest('hex');
  if (!safeEqual(hex.toLowerCase(), expected)) return { ok: false, reason: 'the signature does not match' };
  const seconds = Number(timestamp);
  if (!Number.isFinite(seconds) || Math.abs(now.getTime() - seconds * 1000) > MAILGUN_MAX_SKEW_MS) {
    return { ok: false, reason: "the timestamp is more than 10 minutes away from this server's clock (a replay, or a clock that is off)" };
  }
  return { ok: true };
}

interface MailgunEventData {
  event?: string;
  /** The recipient the event is about. */
  recipient?: string;
  severity?: string;
  message?: { headers?: Record<string, string | undefined> };
  'delivery-status'?: { code?: number; message?: string; description?: string };
}

export function mailgunFeedback(body: unknown): DeliveryFeedback[] {
  const data = (body as { 'event-data'?: MailgunEventData } | null)?.['event-data'];
  if (!data || typeof data !== 'object') return [];
  // Mailgun keeps the Message-ID the message came with, and lists it without brackets.
  const id = data.message?.headers?.['message-id'];
  const match = { messageId: id, providerMessageId: id, ...(typeof data.recipient === 'string' ? { recipient: data.recipient } : {}) };
  const status = data['delivery-status'];
  const diagnostic = [status?.code, status?.message || status?.description].filter((v) => v !== undefined && v !== '').join(' ') || undefined;
  switch (data.event) {
    case 'delivered':
      return [{ type: 'delivered', ...match }];
    case 'failed':
      return [{ type: 'bounced', ...match, bounceType: data.severity === 'permanent' ? 'hard' : 'soft', diagnostic }];
    case 'complained':
      return [{ type: 'complained', ...match }];
    default:
      return [];
  }
}

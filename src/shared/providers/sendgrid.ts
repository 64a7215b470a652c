import { createPublicKey, createVerify, type KeyObject } from 'node:crypto';
import type { DeliveryFeedback } from '../outcomes/provider-events.js';

/**
 * SendGrid's event webhook (docs/outcomes.md): ECDSA (P-256, SHA-256) over
 * `timestamp + raw body`, in the headers X-Twilio-Email-Event-Webhook-Signature (base64 DER)
 * and X-Twilio-Email-Event-Webhook-Timestamp; the verification key is the base64 DER public
 * key shown in SendGrid's console. The body is an array of events.
 */
export const SENDGRID_MAX_SKEW_MS = 10 * 60 * 1000;

/** The console's key, base64 DER (SubjectPublicKeyInfo) or PEM. */
export function sendgridKey(configured: string): KeyObject {
  const trimmed = configured.trim();
  if (trimmed.startsWith('-----BEGIN')) return createPublicKey(trimmed);
  return createPublicKey({ key: Buffer.from(trimmed, 'base64'), format: 'der', type: 'spki' });
}

export type SendgridCheck = { ok: true } | { ok: false; reason: string };

export function verifySendgrid(raw: Buffer, signature: string | undefined, timestamp: string | undefined, key: KeyObject, now: Date): SendgridCheck {
  if (!signature || !timestamp) return { ok: false, reason: 'missing signature headers' };
  const seconds = Number(timestamp);
  if (!Number.isFinite(seconds) || Math.abs(now.getTime() - seconds * 1000) > SENDGRID_MAX_SKEW_MS) {
    return { ok: false, reason: "the timestamp is more than 10 minutes away from this server's clock (a replay, or a clock that is off)" };
  }
  const verifier = createVerify('sha256');
  verifier.update(timestamp);
  verifier.update(raw);
  let valid: boolean;
  try {
    valid = verifier.verify(key, Buffer.from(signature, 'base64'));
  } catch {
    // A signature that is not DER at all.
    valid = false;
  }
  return valid ? { ok: true } : { ok: false, reason: 'the signature does not match' };
}

interface SendgridEvent {
  event?: string;
  /** The recipient the event is about. */
  email?: string;
  'smtp-id'?: string;
  sg_message_id?: string;
  reason?: string;
  status?: string;
  response?: string;
  /** Of a `bounce` event: `bounce` (the mailbox refused) or `blocked` (the receiving server refused the sender). */
  type?: string;
}

/**
 * delivered; bounce = hard, unless its `type` is `blocked` (SendGrid reports a block, about the
 * sender's reputation or content and not the mailbox, as a `bounce` event of that type) = soft;
 * blocked = soft; dropped = soft (SendGrid never tried: the reason
 * may be its own suppression, not the mailbox); deferred = delivery delayed (SendGrid is
 * still retrying, so the email is not marked bounced); spamreport = complaint.
 */
export function sendgridFeedback(body: unknown): DeliveryFeedback[] {
  if (!Array.isArray(body)) return [];
  const out: DeliveryFeedback[] = [];
  for (const item of body as SendgridEvent[]) {
    if (!item || typeof item !== 'object') continue;
    // sg_message_id is the X-Message-Id of the SMTP answer plus a suffix of SendGrid's own.
    const providerMessageId = typeof item.sg_message_id === 'string' ? item.sg_message_id.replace(/\.(filter|recvd).*$/, '') : undefined;
    const match = {
      messageId: typeof item['smtp-id'] === 'string' ? item['smtp-id'] : undefined,
      providerMessageId,
      ...(typeof item.email === 'string' ? { recipient: item.email } : {}),
    };
    const diagnostic = [item.status, item.reason ?? item.response].filter(Boolean).join(' ') || undefined;
    switch (item.event) {
      case 'delivered':
        out.push({ type: 'delivered', ...match });
        break;
      case 'bounce':
        out.push({ type: 'bounced', ...match, bounceType: item.type === 'blocked' ? 'soft' : 'hard', diagnostic });
        break;
      case 'blocked':
      case 'dropped':
        out.push({ type: 'bounced', ...match, bounceType: 'soft', diagnostic });
        break;
      case 'deferred':
        out.push({ type: 'delivery_delayed', ...match, diagnostic });
        break;
      case 'spamreport':
        out.push({ type: 'complained', ...match });
        break;
    }
  }
  return out;
}

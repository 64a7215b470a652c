import { createHmac, randomBytes } from 'node:crypto';

/**
 * Standard Webhooks signatures (https://www.standardwebhooks.com,
 * docs/webhooks.md "A receiver that verifies the signature"): the secret is `whsec_` + base64 of
 * random bytes; `webhook-signature` is `v1,` + base64 of
 * HMAC-SHA256(`{webhook-id}.{webhook-timestamp}.{body}`) keyed with those bytes.
 */
export const SECRET_PREFIX = 'whsec_';
// 32 bytes: within the 24..64 the specification recommends.
const SECRET_BYTES = 32;

export function newWebhookSecret(): string {
  return `${SECRET_PREFIX}${randomBytes(SECRET_BYTES).toString('base64')}`;
}

export function signWebhook(secret: string, messageId: string, timestampSeconds: number, body: string): string {
  const key = Buffer.from(secret.slice(SECRET_PREFIX.length), 'base64');
  return `v1,${createHmac('sha256', key).update(`${messageId}.${timestampSeconds}.${body}`).digest('base64')}`;
}

/** The three headers of one attempt; the timestamp is the attempt's, the id the message's. */
export function webhookHeaders(secret: string, messageId: string, body: string, now: Date): Record<string, string> {
  const timestamp = Math.floor(now.getTime() / 1000);
  return {
    'webhook-id': messageId,
    'webhook-timestamp': String(timestamp),
    'webhook-signature': signWebhook(secret, messageId, timestamp, body),
  };
}

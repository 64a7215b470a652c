import { createPublicKey, createVerify, type KeyObject, X509Certificate } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import { z } from 'zod';

/**
 * Amazon SNS message signatures (docs/outcomes.md, "Amazon SES"). SNS signs a canonical
 * string of the message's fields with the private key of the certificate at
 * `SigningCertURL`: SignatureVersion 1 is SHA1withRSA, 2 is SHA256withRSA. The certificate is
 * fetched over https only, from a host matching SNS_CERT_HOST_PATTERN, and cached, so a
 * forged message cannot make the service fetch an address of the sender's choosing.
 */
export const SnsMessage = z.object({
  Type: z.enum(['Notification', 'SubscriptionConfirmation', 'UnsubscribeConfirmation']),
  MessageId: z.string().min(1),
  TopicArn: z.string().min(1),
  Message: z.string(),
  Timestamp: z.string().min(1),
  SignatureVersion: z.enum(['1', '2']),
  Signature: z.string().min(1),
  SigningCertURL: z.string().min(1),
  Subject: z.string().optional(),
  SubscribeURL: z.string().optional(),
  Token: z.string().optional(),
});
export type SnsMessage = z.infer<typeof SnsMessage>;

/** Why a message was refused; the route answers 401 for each. */
export class SnsSignatureError extends Error {}

// The fields signed, in order (the AWS documentation's "string to sign").
const NOTIFICATION_FIELDS = ['Message', 'MessageId', 'Subject', 'Timestamp', 'TopicArn', 'Type'] as const;
const CONFIRMATION_FIELDS = ['Message', 'MessageId', 'SubscribeURL', 'Timestamp', 'Token', 'TopicArn', 'Type'] as const;

export function snsStringToSign(message: SnsMessage): string {
  const fields = message.Type === 'Notification' ? NOTIFICATION_FIELDS : CONFIRMATION_FIELDS;
  let out = '';
  for (const field of fields) {
    const value = message[field];
    // Subject is signed only when present; the confirmation fields are required.
    if (value === undefined) {
      if (field === 'Subject') continue;
      throw new SnsSignatureError(`the message has no ${field}`);
    }
    out += `${field}\n${value}\n`;
  }
  return out;
}

/** An https URL on a host the pattern allows, or an error naming what is wrong (nothing fetched). */
export function checkSnsUrl(raw: string, hostPattern: RegExp, what: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new SnsSignatureError(`${what} is not a URL`);
  }
  if (url.protocol !== 'https:') throw new SnsSignatureError(`${what} must be https`);
  if (url.username || url.password) throw new SnsSignatureError(`${what} must not carry credentials`);
  if (!hostPattern.test(url.hostname)) throw new SnsSignatureError(`${what} is on a host that is not Amazon SNS (${url.hostname})`);
  return url;
}

// A signing certificate is a few kilobytes; anything larger is not one.
const MAX_CERTIFICATE_BYTES = 64 * 1024;
const FETCH_TIMEOUT_MS = 5_000;

/**
 * The signing certificates fetched so far (by URL; SNS rotates them rarely), and the fetches
 * in flight, so that a burst of notifications fetches a certificate once.
 */
export class SnsCertificates {
  private readonly cache = new LRUCache<string, KeyObject>({ max: 100, ttl: 24 * 60 * 60 * 1000 });
  private readonly pending = new Map<string, Promise<KeyObject>>();

  constructor(private readonly fetchImpl: typeof fetch = fetch) {}

  async publicKey(url: URL): Promise<KeyObject> {
    const key = url.href;
    const cached = this.cache.get(key);
    if (cached) return cached;
    let inFlight = this.pending.get(key);
    if (!inFlight) {
      inFlight = this.download(url).finally(() => this.pending.delete(key));
      this.pending.set(key, inFlight);
    }
    return inFlight;
  }

  private async download(url: URL): Promise<KeyObject> {
    let pem: string;
    try {
      const response = await this.fetchImpl(url, { redirect: 'error', signal: AbortSignal.timeout(FETCH_TIMEOUT_MS) });
      if (!response.ok) throw new Error(`answered ${response.status}`);
      const body = Buffer.from(await response.arrayBuffer());
      if (body.length > MAX_CERTIFICATE_BYTES) throw new Error('too large');
      pem = body.toString('utf8');
    } catch (error) {
      throw new SnsSignatureError(`the signing certificate could not be fetched (${(error as Error).message})`);
    }
    let key: KeyObject;
    try {
      const certificate = new X509Certificate(pem);
      const now = Date.now();
      if (Date.parse(certificate.validFrom) > now || Date.parse(certificate.validTo) < now) throw new Error('expired or not yet valid');
      key = createPublicKey(certificate.publicKey.export({ type: 'spki', format: 'pem' }));
    } catch (error) {
      throw new SnsSignatureError(`the signing certificate is not usable (${(error as Error).message})`);
    }
    this.cache.set(url.href, key);
    return key;
  }
}

/** SNS keeps retrying a message for at most an hour by default; an older one is a replay. */
export const SNS_MAX_AGE_MS = 60 * 60 * 1000;

/**
 * Verifies a parsed SNS message: certificate URL, timestamp, signature. Throws
 * SnsSignatureError when any of them is wrong.
 */
export async function verifySnsMessage(
  message: SnsMessage,
  deps: { certificates: SnsCertificates; hostPattern: RegExp; now: Date },
): Promise<void> {
  const certUrl = checkSnsUrl(message.SigningCertURL, deps.hostPattern, 'SigningCertURL');
  const sent = Date.parse(message.Timestamp);
  if (Number.isNaN(sent)) throw new SnsSignatureError('Timestamp is not a date');
  if (deps.now.getTime() - sent > SNS_MAX_AGE_MS || sent - deps.now.getTime() > 5 * 60 * 1000) {
    throw new SnsSignatureError('Timestamp is too old or in the future');
  }
  const canonical = snsStringToSign(message);
  const key = await deps.certificates.publicKey(certUrl);
  const verifier = createVerify(message.SignatureVersion === '1' ? 'RSA-SHA1' : 'RSA-SHA256');
  verifier.update(canonical, 'utf8');
  if (!verifier.verify(key, Buffer.from(message.Signature, 'base64'))) throw new SnsSignatureError('the signature does not match');
}

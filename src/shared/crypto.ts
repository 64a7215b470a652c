import { createCipheriv, createDecipheriv, createHash, createHmac, createSecretKey, randomBytes, timingSafeEqual, type KeyObject } from 'node:crypto';

export function sha256Hex(value: string): string {
  return createHash('sha256').update(value).digest('hex');
}

/** Constant-time comparison of two strings (false when lengths differ). */
export function safeEqual(a: string, b: string): boolean {
  const ab = Buffer.from(a);
  const bb = Buffer.from(b);
  return ab.length === bb.length && timingSafeEqual(ab, bb);
}

/**
 * AES-256-GCM under a key derived from SECRET_KEY. Output: `v1.<iv>.<tag>.<ciphertext>`,
 * each part base64url, so a value can be stored in a text column and the scheme rotated.
 */
export class SecretBox {
  private readonly key: Buffer;

  constructor(secretKey: string) {
    this.key = createHash('sha256').update(`mailroom:secret-box:${secretKey}`).digest();
  }

  seal(plaintext: string): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.key, iv);
    const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
    return ['v1', iv, cipher.getAuthTag(), ciphertext].map((p) => (typeof p === 'string' ? p : p.toString('base64url'))).join('.');
  }

  open(sealed: string): string {
    const [version, iv, tag, ciphertext] = sealed.split('.');
    if (version !== 'v1' || !iv || !tag || ciphertext === undefined) throw new Error('unknown sealed value format');
    const decipher = createDecipheriv('aes-256-gcm', this.key, Buffer.from(iv, 'base64url'));
    decipher.setAuthTag(Buffer.from(tag, 'base64url'));
    return Buffer.concat([decipher.update(Buffer.from(ciphertext, 'base64url')), decipher.final()]).toString('utf8');
  }
}

/**
 * Compact signed tokens for public links (tracking, unsubscribe, confirmation):
 * `<payload>.<mac>` where payload is base64url text and mac a truncated HMAC-SHA256 under a
 * key derived from SECRET_KEY and the token's purpose, so a token of one kind is never
 * accepted as another.
 */
export class LinkSigner {
  private readonly secretKey: string;
  /** The HMAC key of each purpose, prepared once: links are verified on every tracking hit. */
  private readonly keys = new Map<string, KeyObject>();

  constructor(secretKey: string) {
    this.secretKey = secretKey;
  }

  private key(purpose: string): KeyObject {
    let key = this.keys.get(purpose);
    if (!key) {
      let bytes = Buffer.from(`mailroom:link:${purpose}:${this.secretKey}`, 'utf8');
      // HMAC hashes a key longer than the block (64 bytes) before use (RFC 2104): doing it
      // here once gives the same MACs without hashing the key again for every link.
      if (bytes.length > 64) bytes = createHash('sha256').update(bytes).digest();
      key = createSecretKey(bytes);
      this.keys.set(purpose, key);
    }
    return key;
  }

  private mac(purpose: string, payload: string): string {
    // 16 bytes of HMAC: forging one needs 2^128 tries, and links stay short.
    return createHmac('sha256', this.key(purpose)).update(payload).digest().toString('base64url', 0, 16);
  }

  sign(purpose: string, value: string): string {
    const payload = Buffer.from(value, 'utf8').toString('base64url');
    return `${payload}.${this.mac(purpose, payload)}`;
  }

  /** The signed value, or null when the token is malformed, altered or of another purpose. */
  verify(purpose: string, token: string): string | null {
    const dot = token.indexOf('.');
    if (dot <= 0 || dot !== token.lastIndexOf('.')) return null;
    const payload = token.slice(0, dot);
    if (!sameText(token.slice(dot + 1), this.mac(purpose, payload))) return null;
    return Buffer.from(payload, 'base64url').toString('utf8');
  }
}

/** Constant-time comparison of two short strings of the same alphabet, without allocating. */
function sameText(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

export function randomHex(bytes: number): string {
  return randomBytes(bytes).toString('hex');
}

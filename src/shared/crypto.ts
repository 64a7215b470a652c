import { createCipheriv, createDecipheriv, createHash, hash, randomBytes, randomFillSync, timingSafeEqual } from 'node:crypto';

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
    try {
      return Buffer.concat([decipher.update(Buffer.from(ciphertext, 'base64url')), decipher.final()]).toString('utf8');
    } catch (error) {
      // What an operator needs to read in the log: most often a process (a CLI run elsewhere)
      // that sealed it with a SECRET_KEY of its own.
      throw new Error('cannot open a sealed secret: it was sealed with another SECRET_KEY than this process has (or was altered)', { cause: error });
    }
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
  /** Each purpose's HMAC pads, prepared once: links are verified on every tracking hit. */
  private readonly pads = new Map<string, { inner: Buffer; outer: Buffer }>();
  private message = Buffer.alloc(1_024);

  constructor(secretKey: string) {
    this.secretKey = secretKey;
  }

  private padsOf(purpose: string): { inner: Buffer; outer: Buffer } {
    let pads = this.pads.get(purpose);
    if (!pads) {
      let key = Buffer.from(`mailroom:link:${purpose}:${this.secretKey}`, 'utf8');
      if (key.length > 64) key = createHash('sha256').update(key).digest();
      // The outer block has room for the inner hash after the pad.
      const inner = Buffer.alloc(64, 0x36);
      const outer = Buffer.alloc(96, 0x5c);
      for (let i = 0; i < key.length; i++) {
        inner[i]! ^= key[i]!;
        outer[i]! ^= key[i]!;
      }
      pads = { inner, outer };
      this.pads.set(purpose, pads);
    }
    return pads;
  }

  /**
   * HMAC-SHA256 as two one-shot hashes over the prepared pads (RFC 2104), written into
   * buffers reused from call to call (the computation is synchronous): `createHmac` sets up
   * an OpenSSL MAC context for every call, which costs more than the hashing of a link.
   */
  private mac(purpose: string, payload: string): string {
    const { inner, outer } = this.padsOf(purpose);
    const length = Buffer.byteLength(payload, 'utf8');
    if (this.message.length < 64 + length) this.message = Buffer.alloc(Math.max(64 + length, 2 * this.message.length));
    inner.copy(this.message, 0);
    this.message.write(payload, 64, 'utf8');
    hash('sha256', this.message.subarray(0, 64 + length), 'buffer').copy(outer, 64);
    // 16 bytes of HMAC: forging one needs 2^128 tries, and links stay short.
    return hash('sha256', outer, 'buffer').toString('base64url', 0, 16);
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

const POOL_BYTES = 4096;

/**
 * Cryptographically random bytes drawn from a pool refilled 4 KiB at a time (randomFillSync),
 * each byte used once, as node's randomUUID does: ids (ulid asked the OS for one byte per
 * character), MIME boundaries (nodemailer for 8 bytes a part) and token secrets share it.
 */
function randomPool() {
  const pool = Buffer.allocUnsafe(POOL_BYTES);
  let next = POOL_BYTES;
  const take = (bytes: number) => {
    if (next + bytes > POOL_BYTES) {
      randomFillSync(pool);
      next = 0;
    }
    next += bytes;
    return next - bytes;
  };
  return {
    /** In [0, 1): a byte over 256 maps evenly onto ulid's 32 characters. */
    fraction: () => pool[take(1)]! / 256,
    hex(bytes: number): string {
      if (bytes > POOL_BYTES) return randomBytes(bytes).toString('hex');
      const at = take(bytes);
      return pool.toString('hex', at, at + bytes);
    },
  };
}
const random = randomPool();

/** `bytes` random bytes in hex (a token secret, a MIME boundary). */
export function randomHex(bytes: number): string {
  return random.hex(bytes);
}

/** A random number in [0, 1) with 8 bits of randomness (ulid draws one a character). */
export function randomFraction(): number {
  return random.fraction();
}

import { createHmac, timingSafeEqual } from 'node:crypto';
import { RETURN_PATH_LABEL } from '../domains/records.js';

/** The local part's fixed start: `b+{token}`. */
const RETURN_PATH_PREFIX = 'b+';
const EMAIL_PREFIX = 'eml_';
/** The body of an email id: a lower-case ULID (src/shared/ids.ts). */
const ULID_LENGTH = 26;
const ULID_ALPHABET = /^[0-9a-hjkmnp-tv-z]{26}$/;
/**
 * 10 bytes of HMAC-SHA256 (80 bits): guessing a valid address takes ~2^79 SMTP attempts,
 * and `b+` + 26 + 16 = 44 characters stays well under the 64-character local-part limit
 * (RFC 5321 4.5.3.1.1).
 */
const MAC_BYTES = 10;
const MAC_LENGTH = 16;
const BASE32 = 'abcdefghijklmnopqrstuvwxyz234567';

/** RFC 4648 base32, lower case, no padding (10 bytes are exactly 16 characters). */
function base32(bytes: Buffer): string {
  let out = '';
  let bits = 0;
  let value = 0;
  for (const byte of bytes) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += BASE32[(value << (5 - bits)) & 31];
  return out;
}

/**
 * Per-email VERP return paths (docs/outcomes.md "The return path (VERP)"):
 * `b+{ulid}{mac}@bounces.{domain}`. The token is the email id's ULID and an HMAC of it under a key
 * derived from SECRET_KEY, all in lower case: mail systems may change the case of a local part, and
 * base32 survives that.
 */
export class ReturnPaths {
  private readonly key: Buffer;

  constructor(secretKey: string) {
    // A key of its own, so a return-path MAC is never valid as any other signature.
    this.key = createHmac('sha256', secretKey).update('mailroom:return-path').digest();
  }

  private mac(ulid: string): string {
    return base32(createHmac('sha256', this.key).update(ulid).digest().subarray(0, MAC_BYTES));
  }

  /** The local part for an email id (`eml_…`). */
  localPart(emailId: string): string {
    const ulid = emailId.startsWith(EMAIL_PREFIX) ? emailId.slice(EMAIL_PREFIX.length) : emailId;
    return `${RETURN_PATH_PREFIX}${ulid}${this.mac(ulid)}`;
  }

  /** The envelope sender of an email sent from `domain`'s return-path host (or BOUNCE_DOMAIN). */
  address(emailId: string, host: string): string {
    return `${this.localPart(emailId)}@${host}`;
  }

  /**
   * The email id an address stands for, or null when it is not a return path of ours or its
   * MAC is wrong (forged, altered, or made with another SECRET_KEY). Case-insensitive.
   */
  verify(address: string): { emailId: string; host: string } | null {
    const at = address.lastIndexOf('@');
    if (at <= 0 || at !== address.indexOf('@')) return null;
    const local = address.slice(0, at).toLowerCase();
    const host = address.slice(at + 1).toLowerCase().replace(/\.$/, '');
    if (host === '' || local.length !== RETURN_PATH_PREFIX.length + ULID_LENGTH + MAC_LENGTH || !local.startsWith(RETURN_PATH_PREFIX)) return null;
    const ulid = local.slice(RETURN_PATH_PREFIX.length, RETURN_PATH_PREFIX.length + ULID_LENGTH);
    if (!ULID_ALPHABET.test(ulid)) return null;
    const given = Buffer.from(local.slice(RETURN_PATH_PREFIX.length + ULID_LENGTH), 'latin1');
    const expected = Buffer.from(this.mac(ulid), 'latin1');
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return null;
    return { emailId: `${EMAIL_PREFIX}${ulid}`, host };
  }
}

/**
 * The host of an email's return path: the sending domain's own return-path host when the
 * organization has that domain (its records publish the MX and SPF there), else BOUNCE_DOMAIN.
 */
export function returnPathHost(fromDomain: string, ownDomain: boolean, bounceDomain: string): string {
  return ownDomain ? `${RETURN_PATH_LABEL}.${fromDomain.toLowerCase()}` : bounceDomain;
}

/**
 * Whether a host can be a return-path host at all: BOUNCE_DOMAIN, or the return-path label of
 * some domain (`bounces.{domain}`). Which domain is the email's own is known only once the email
 * is read (the worker checks it); the listener refuses any other host at RCPT. `host` as
 * `verify` gives it, `bounceDomain` as the config does.
 */
export function isReturnPathHost(host: string, bounceDomain: string): boolean {
  // Both normalized already: the host by `verify` (lower case, no final dot), BOUNCE_DOMAIN by the config.
  return host === bounceDomain || (host.startsWith(`${RETURN_PATH_LABEL}.`) && host.length > RETURN_PATH_LABEL.length + 1);
}

import { randomFillSync } from 'node:crypto';
import { monotonicFactory } from 'ulid';

export const ID_PREFIXES = ['org', 'tok', 'sub', 'tag', 'cmp', 'eml', 'dom', 'snd', 'evt', 'ver', 'usr', 'whk', 'msg', 'rpt'] as const;
export type IdPrefix = (typeof ID_PREFIXES)[number];

const POOL_BYTES = 4096;

/**
 * Cryptographically random bytes drawn from a pool refilled 4 KiB at a time (randomFillSync).
 * ulid's own generator asks the OS for one byte per character (16 calls an id whenever the
 * millisecond changes): 40 us an id, a tenth of the CPU of a single send; nodemailer draws
 * 8 bytes for each MIME part of every message in the same way.
 */
function randomPool() {
  const pool = Buffer.allocUnsafe(POOL_BYTES);
  let next = POOL_BYTES;
  const byte = () => {
    if (next === POOL_BYTES) {
      randomFillSync(pool);
      next = 0;
    }
    return pool[next++]!;
  };
  return {
    /** In [0, 1), for the ULID factory: a byte over 256 maps evenly onto its 32 characters. */
    fraction: () => byte() / 256,
    hex(bytes: number): string {
      let out = '';
      for (let i = 0; i < bytes; i++) out += byte().toString(16).padStart(2, '0');
      return out;
    },
  };
}

const random = randomPool();
const ulid = monotonicFactory(random.fraction);

/** `bytes` random bytes in hex (a MIME boundary, a nonce that is not a secret key). */
export function randomHex(bytes: number): string {
  return random.hex(bytes);
}

/**
 * A prefixed id whose body is a lower-case ULID: URL-safe, and sortable by creation time
 * both as text and within one process (the factory is monotonic within a millisecond).
 */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${ulid().toLowerCase()}`;
}

export function isId(value: string, prefix: IdPrefix): boolean {
  return value.length === prefix.length + 27 && value.startsWith(`${prefix}_`) && /^[0-9a-hjkmnp-tv-z]{26}$/.test(value.slice(prefix.length + 1));
}

import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { redisKey, type Services } from '../../shared/container.js';
import { normalizeUserEmail } from '../../shared/users/service.js';

export const SESSION_COOKIE = 'mailroom_session';
// docs/dashboard.md "Getting in": a session ends after 12 hours without a request.
export const SESSION_IDLE_SECONDS = 12 * 3600;
// docs/dashboard.md "Getting in": 5 failed sign-ins a minute for one address, then 429.
export const SIGN_IN_FAILURES = 5;
export const SIGN_IN_WINDOW_SECONDS = 60;
// How long a secret created by a form waits to be shown on the page the form redirects to.
const SHOWN_SECONDS = 300;

export interface Session {
  userId: string;
  organizationId: string;
  email: string;
  /** The synchronizer token every change must carry (form field or header). */
  csrf: string;
}

const digest = (value: string) => createHash('sha256').update(value).digest('hex');

/**
 * Sessions live in Redis (key: the SHA-256 of the cookie, so a Redis dump holds no usable
 * cookie), shared by every API process, each refreshed to 12 hours by every request.
 */
export class SessionStore {
  constructor(private readonly services: Services) {}

  private key(id: string): string {
    return redisKey(this.services.config, 'dashboard', 'session', digest(id));
  }

  async create(data: Omit<Session, 'csrf'>): Promise<{ id: string; session: Session }> {
    const id = randomBytes(32).toString('base64url');
    const session = { ...data, csrf: randomBytes(24).toString('base64url') };
    await this.services.redis.set(this.key(id), JSON.stringify(session), 'EX', SESSION_IDLE_SECONDS);
    return { id, session };
  }

  async get(id: string): Promise<Session | null> {
    if (!/^[\w-]{43}$/.test(id)) return null;
    const key = this.key(id);
    const [[, value]] = (await this.services.redis.multi().get(key).expire(key, SESSION_IDLE_SECONDS).exec()) as [[unknown, string | null]];
    return value ? (JSON.parse(value) as Session) : null;
  }

  async destroy(id: string): Promise<void> {
    await this.services.redis.del(this.key(id));
  }

  /**
   * A secret to show once on the page a form post redirects to (post, redirect, get: a reload
   * shows the list and creates nothing twice). Kept five minutes, sealed with SECRET_KEY, for
   * this session only; `takeShown` hands it over once.
   */
  async keepToShow(sessionId: string, value: Record<string, string>): Promise<string> {
    const id = randomBytes(12).toString('base64url');
    await this.services.redis.set(this.shownKey(sessionId, id), this.services.box.seal(JSON.stringify(value)), 'EX', SHOWN_SECONDS);
    return id;
  }

  async takeShown(sessionId: string, id: string | undefined): Promise<Record<string, string> | null> {
    if (!id || !/^[\w-]{16}$/.test(id)) return null;
    const sealed = await this.services.redis.getdel(this.shownKey(sessionId, id));
    return sealed ? (JSON.parse(this.services.box.open(sealed)) as Record<string, string>) : null;
  }

  private shownKey(sessionId: string, id: string): string {
    return redisKey(this.services.config, 'dashboard', 'shown', digest(sessionId), id);
  }

  private failuresKey(email: string): string {
    return redisKey(this.services.config, 'dashboard', 'sign-in-failures', digest(normalizeUserEmail(email)));
  }

  /**
   * Counts a sign-in attempt of the address before its password is checked; seconds until
   * the address may try again, or 0 when this attempt may go on. Counting first is what keeps
   * a burst to the limit: a check before the password hash (~100 ms) and a count after it let
   * every concurrent attempt of a burst through.
   */
  async attempt(email: string): Promise<number> {
    const key = this.failuresKey(email);
    // The window starts at the first attempt (NX): more attempts do not extend it.
    const [[, count], , [, ttl]] = (await this.services.redis.multi().incr(key).expire(key, SIGN_IN_WINDOW_SECONDS, 'NX').ttl(key).exec()) as [
      [unknown, number],
      unknown,
      [unknown, number],
    ];
    return count > SIGN_IN_FAILURES ? Math.max(1, ttl) : 0;
  }

  /** The attempt signed in: it is not a failure (the count is given back, never below 0). */
  async succeeded(email: string): Promise<void> {
    await this.services.redis.eval(UNCOUNT, 1, this.failuresKey(email));
  }
}

// Takes one attempt back, and drops the counter at 0; a counter already expired stays gone
// (a DECR would recreate it without an expiry).
const UNCOUNT = `if redis.call('exists', KEYS[1]) == 0 then return 0 end
local n = redis.call('decr', KEYS[1])
if n <= 0 then redis.call('del', KEYS[1]) end
return n`;

export function sameToken(given: unknown, expected: string): boolean {
  if (typeof given !== 'string' || given.length !== expected.length) return false;
  return timingSafeEqual(Buffer.from(given), Buffer.from(expected));
}

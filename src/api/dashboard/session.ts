import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { redisKey, type Services } from '../../shared/container.js';
import { normalizeUserEmail } from '../../shared/users/service.js';

export const SESSION_COOKIE = 'mailroom_session';
// docs/dashboard.md "Getting in": a session ends after 12 hours without a request.
export const SESSION_IDLE_SECONDS = 12 * 3600;
// docs/dashboard.md "Getting in": 5 failed sign-ins a minute for one address, then 429.
export const SIGN_IN_FAILURES = 5;
export const SIGN_IN_WINDOW_SECONDS = 60;

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

  private failuresKey(email: string): string {
    return redisKey(this.services.config, 'dashboard', 'sign-in-failures', digest(normalizeUserEmail(email)));
  }

  /** Seconds until the address may try again, or 0. */
  async throttled(email: string): Promise<number> {
    const key = this.failuresKey(email);
    const [[, count], [, ttl]] = (await this.services.redis.multi().get(key).ttl(key).exec()) as [[unknown, string | null], [unknown, number]];
    return Number(count ?? 0) >= SIGN_IN_FAILURES ? Math.max(1, ttl) : 0;
  }

  async failed(email: string): Promise<void> {
    const key = this.failuresKey(email);
    // The window starts at the first failure (NX): more failures do not extend it.
    await this.services.redis.multi().incr(key).expire(key, SIGN_IN_WINDOW_SECONDS, 'NX').exec();
  }
}

export function sameToken(given: unknown, expected: string): boolean {
  if (typeof given !== 'string' || given.length !== expected.length) return false;
  return timingSafeEqual(Buffer.from(given), Buffer.from(expected));
}

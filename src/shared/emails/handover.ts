import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { Coalescer } from './coalescer.js';

/**
 * The hand-over fence: one Redis key an email, `{prefix}:handover:{email id}`, that records
 * how far the hand-over of a claimed (`sending`) email got, so a worker that takes over the
 * job of a dead one knows whether the provider may have the message:
 *
 * - no key: the message was never committed (its final `.` never sent): safe to send;
 * - `reclaim:{owner}`: a worker took the email over from a dead (or stalled) one;
 * - `dot:{owner}`: the final `.` of DATA may be on the wire: the provider may or may not
 *   have accepted it (the one ambiguous window; see docs/operations.md);
 * - `accepted:{message id}`: the provider accepted it; only the status write is missing.
 *
 * Both claims of the key are compare-and-set (Lua), so a worker that stalled but still
 * runs cannot commit once another took its email over: it aborts the DATA instead.
 */
export class HandoverFence {
  /** This process; a dead process's `dot:` keys name it (the scale-out test reads them). */
  readonly owner = `${process.pid}-${randomBytes(4).toString('hex')}`;

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    /** Kept longer than the send lease, so the reconciler still reads it. */
    private readonly ttlMs = 30 * 60_000,
  ) {}

  key(emailId: string): string {
    return `${this.prefix}:handover:${emailId}`;
  }

  /** Takes an email over from a dead worker: 'ok' with a token, or the key's current value. */
  async reclaim(emailId: string): Promise<{ token: string } | { current: string }> {
    const token = `reclaim:${this.owner}-${randomBytes(4).toString('hex')}`;
    const result = (await this.redis.eval(
      `local v = redis.call('GET', KEYS[1])
       if v then return v end
       redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
       return false`,
      1,
      this.key(emailId),
      token,
      this.ttlMs,
    )) as string | null;
    return result ? { current: result } : { token };
  }

  /**
   * Right before the final `.`: true when this worker still owns the email (`expected` is
   * its reclaim token, or undefined for the first claim) and the key now says `dot:`.
   */
  async commit(emailId: string, expected: string | undefined): Promise<boolean> {
    const result = await this.redis.eval(
      `local v = redis.call('GET', KEYS[1])
       if (v == false and ARGV[1] == '') or v == ARGV[1] then
         redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
         return 1
       end
       return 0`,
      1,
      this.key(emailId),
      expected ?? '',
      `dot:${this.owner}`,
      this.ttlMs,
    );
    return result === 1;
  }

  /**
   * The provider accepted: recorded before the (group-committed) status write. The
   * acceptances of one turn of the event loop go to Redis as one pipeline (one write).
   */
  accepted(emailId: string, messageId: string): Promise<void> {
    return this.acceptances.submit([emailId, messageId]);
  }

  private readonly acceptances = new Coalescer<[string, string], void>(async (items) => {
    const pipeline = this.redis.pipeline();
    for (const [emailId, messageId] of items) pipeline.set(this.key(emailId), `accepted:${messageId}`, 'PX', this.ttlMs);
    const replies = (await pipeline.exec()) ?? [];
    const failed = replies.find(([error]) => error)?.[0];
    if (failed || replies.length !== items.length) throw failed ?? new Error('Redis did not answer every acceptance');
    return items.map(() => undefined);
  });

  async read(emailId: string): Promise<string | null> {
    return this.redis.get(this.key(emailId));
  }

  async readMany(emailIds: string[]): Promise<(string | null)[]> {
    if (emailIds.length === 0) return [];
    return this.redis.mget(emailIds.map((id) => this.key(id)));
  }

  /** Once the status says sent (or failed), the key has done its work. */
  async clear(emailIds: string[]): Promise<void> {
    if (emailIds.length > 0) await this.redis.unlink(emailIds.map((id) => this.key(id)));
  }
}

/** Another worker took this email over: this one must not commit it. */
export class FenceLostError extends Error {
  constructor(emailId: string) {
    super(`email ${emailId} was taken over by another worker`);
    this.name = 'FenceLostError';
  }
}

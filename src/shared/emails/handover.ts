import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';

/**
 * The hand-over fence: one Redis key an email, `{prefix}:handover:{email id}`, that records
 * how far the hand-over of a claimed (`sending`) email got, so a worker that takes over the
 * job of a dead one knows whether the provider may have the message:
 *
 * - no key: the message was never committed (its final `.` never written): safe to send;
 * - `reclaim:{owner}`: a worker took the email over from a dead (or stalled) one;
 * - `pre:{owner}`: the worker owns the email and was about to write the final `.`; the `.`
 *   itself was not written yet (its `dot:` record is written first, in the same turn of the
 *   event loop): safe to send again once that worker is gone;
 * - `dot:{owner}`: the final `.` of DATA was written and the provider's answer not read:
 *   the provider may or may not have accepted it (the one ambiguous window; see
 *   docs/operations.md);
 * - `accepted:{message id}`: the provider accepted it; only the status write is missing.
 *
 * Taking an email over and committing it are compare-and-set (Lua), so a worker that
 * stalled but still runs cannot commit once another took its email over: it aborts the
 * DATA instead.
 */
// The compare-and-set steps, registered with ioredis's `defineCommand`: sent by their SHA
// (EVALSHA; ioredis loads a script again when Redis has forgotten it) instead of their text
// with every email.
const SCRIPTS = {
  mailroomFenceReclaim: `local v = redis.call('GET', KEYS[1])
       if v and string.sub(v, 1, 8) ~= 'reclaim:' and string.sub(v, 1, 4) ~= 'pre:' then return v end
       redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
       return false`,
  // The reconciler's take-over: like reclaim, but a `pre:` or `reclaim:` written recently
  // (its age read from the key's TTL: every write sets the same one) is left alone, and it
  // answers whether it seized and the value found ('' when there was none).
  mailroomFenceSeize: `local v = redis.call('GET', KEYS[1])
       if v then
         local pre = string.sub(v, 1, 4) == 'pre:'
         if not pre and string.sub(v, 1, 8) ~= 'reclaim:' then return {0, v} end
         local age = tonumber(ARGV[2]) - redis.call('PTTL', KEYS[1])
         if age < tonumber(pre and ARGV[3] or ARGV[4]) then return {0, v} end
       end
       redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
       return {1, v or ''}`,
  mailroomFencePrepare: `local v = redis.call('GET', KEYS[1])
       if (v == false and ARGV[1] == '') or v == ARGV[1] then
         redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
         return 1
       end
       return 0`,
  mailroomFenceDot: `if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
       return 1`,
  mailroomFenceRelease: `if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
       return 0`,
} as const;

type FenceRedis = Redis & Record<keyof typeof SCRIPTS, (key: string, ...args: (string | number)[]) => Promise<unknown>>;

export class HandoverFence {
  /** This process; a dead process's `dot:` keys name it (the scale-out test reads them). */
  readonly owner = `${process.pid}-${randomBytes(4).toString('hex')}`;
  private readonly redis: FenceRedis;
  // Values are the owner and a counter: unique within the process, the owner tells processes
  // apart, and no random bytes are drawn for every email.
  private sequence = 0;

  constructor(
    redis: Redis,
    private readonly prefix: string,
    /** Kept longer than the send lease, so the reconciler still reads it. */
    private readonly ttlMs = 30 * 60_000,
  ) {
    for (const [name, lua] of Object.entries(SCRIPTS)) {
      if (!(name in redis)) redis.defineCommand(name, { numberOfKeys: 1, lua });
    }
    this.redis = redis as FenceRedis;
  }

  private unique(): string {
    return `${this.owner}-${(this.sequence++).toString(36)}`;
  }

  key(emailId: string): string {
    return `${this.prefix}:handover:${emailId}`;
  }

  /**
   * Takes an email over from a dead worker: a token when nothing can have reached the
   * provider (no key, `reclaim:` or `pre:`, replaced at once), else the key's value
   * (`dot:` or `accepted:`).
   */
  async reclaim(emailId: string): Promise<{ token: string } | { current: string }> {
    const token = `reclaim:${this.unique()}`;
    const result = (await this.redis.mailroomFenceReclaim(
      this.key(emailId),
      token,
      this.ttlMs,
    )) as string | null;
    return result ? { current: result } : { token };
  }

  /**
   * The reconciler's take-over of emails claimed so long ago that their worker is presumed
   * gone (it may only be stalled): each key that says the `.` was not written (none, `pre:`,
   * `reclaim:`) is set to a `reclaim:` of this process, so a stalled worker that wakes up
   * fails its `prepare` and never commits the message. Left alone: `dot:` and `accepted:`;
   * a `pre:` younger than `preAgeMs` (a live worker is writing its `.` right now: its `dot:`
   * must not be lost); a `reclaim:` younger than `reclaimAgeMs` (another worker is taking the
   * email over right now). Answers, for each email, whether it was seized and the value found
   * ('' for no key).
   */
  async seize(emailIds: readonly string[], ages: { preAgeMs: number; reclaimAgeMs: number }): Promise<{ seized: boolean; found: string }[]> {
    return Promise.all(
      emailIds.map(async (emailId) => {
        const token = `reclaim:${this.unique()}`;
        const [seized, found] = (await this.redis.mailroomFenceSeize(this.key(emailId), token, this.ttlMs, ages.preAgeMs, ages.reclaimAgeMs)) as [number, string];
        return { seized: seized === 1, found };
      }),
    );
  }

  /**
   * Right before the final `.`: the `pre:` value now in the key when this worker still owns
   * the email (`expected` is its reclaim token, or undefined for the first claim), else
   * undefined. The `.` may then be written, right after `dot()`.
   */
  async prepare(emailId: string, expected: string | undefined): Promise<string | undefined> {
    const value = `pre:${this.unique()}`;
    const result = await this.redis.mailroomFencePrepare(
      this.key(emailId),
      expected ?? '',
      value,
      this.ttlMs,
    );
    return result === 1 ? value : undefined;
  }

  /**
   * Called synchronously right before the final `.` is written (not awaited in between):
   * the command is on Redis's socket before the `.` is on the relay's, so a worker killed in
   * between leaves at worst a `dot:` whose `.` never went out (never the reverse).
   */
  dot(emailId: string, prepared: string): Promise<unknown> {
    return this.redis.mailroomFenceDot(
      this.key(emailId),
      prepared,
      `dot:${this.owner}`,
      this.ttlMs,
    );
  }

  /** Gives the email back (the `.` was not written): only while the key is still `prepared`. */
  async release(emailId: string, prepared: string): Promise<boolean> {
    const result = await this.redis.mailroomFenceRelease(
      this.key(emailId),
      prepared,
    );
    return result === 1;
  }

  /**
   * The provider accepted: called synchronously when its answer is read, so the command is
   * on Redis's socket in the same turn of the event loop (a worker killed after reading the
   * answer still leaves the record), before the (group-committed) status write.
   */
  accepted(emailId: string, messageId: string): Promise<unknown> {
    return this.redis.set(this.key(emailId), `accepted:${messageId}`, 'PX', this.ttlMs);
  }

  async read(emailId: string): Promise<string | null> {
    return this.redis.get(this.key(emailId));
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

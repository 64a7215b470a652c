import type { SendMailOptions } from 'nodemailer';
import { composeMessage, type Composed } from './compose.js';
import { renderEmail, type Rendered, type RenderInput } from './render.js';
import type { Logger } from '../logger.js';
import type { RenderPool } from './render-pool.js';
import type { RenderAnswer } from './render-task.js';

// A thread that keeps failing is said once a minute, not once a message.
const WARN_EVERY_MS = 60_000;

/** The CPU-bound steps of a hand-over: an email rendered, a message built. */
export interface OffLoop {
  render(input: RenderInput): Promise<Rendered>;
  compose(mail: SendMailOptions): Promise<Composed>;
}

/**
 * A worker's rendering and building of the messages it delivers (docs/operations.md "Delivery
 * threads"): in `pool`'s thread when there is one, so that the event loop only talks to the
 * relay, Redis and PostgreSQL, and the process uses a second core; on the event loop without
 * one (DELIVERY_THREADS=0). The functions are the same either way. A task the thread fails (its
 * content is refused, the thread died or was busy too long, the pool is closing) is done again
 * on the event loop: a refusal then throws its own error (class, message, nodemailer code) as it
 * always did, and nothing else about an email changes because a thread was lost. A failure of
 * the thread (not of the content: the event loop then does what the thread did not) is logged,
 * at most once a minute with the number of messages it cost.
 */
export function offLoop(pool: RenderPool | undefined, logger?: Pick<Logger, 'warn'>): OffLoop {
  if (!pool) return { render: async (input) => renderEmail(input), compose: composeMessage };
  let unsaid = 0;
  let saidAt = -Infinity;
  const threadFailed = (reason: unknown) => {
    unsaid++;
    if (performance.now() - saidAt < WARN_EVERY_MS) return;
    logger?.warn({ err: reason, messages: unsaid }, 'delivery thread failed; the message was rendered and built on the event loop');
    unsaid = 0;
    saidAt = performance.now();
  };
  /**
   * The thread's value, else `work` done on the event loop: a refusal of the content then throws
   * from `work`; when `work` succeeds, the failure was the thread's own, and is logged.
   */
  const inThread = async <T>(asked: Promise<RenderAnswer & ({ ok: false } | { value: T })>, work: () => T | Promise<T>): Promise<T> => {
    let failed: unknown;
    try {
      const answer = await asked;
      if (answer.ok) return answer.value;
      failed = `${answer.name}: ${answer.message}`;
    } catch (error) {
      failed = error;
    }
    const done = await work();
    threadFailed(failed);
    return done;
  };
  return {
    render: (input) => inThread(pool.answer({ kind: 'email', input }), () => renderEmail(input)),
    async compose(mail) {
      const composed = await inThread(pool.answer({ kind: 'compose', mail }), () => composeMessage(mail));
      // A Buffer crosses the thread boundary as a plain Uint8Array (moved when it fills its own
      // memory, else copied: render-thread.ts), typed as the Buffer it was.
      const raw: Uint8Array = composed.raw;
      return Buffer.isBuffer(raw) ? composed : { ...composed, raw: Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength) };
    },
  };
}

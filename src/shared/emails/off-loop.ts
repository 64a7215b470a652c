import type { SendMailOptions } from 'nodemailer';
import { composeMessage, type Composed } from './compose.js';
import { renderEmail, type Rendered, type RenderInput } from './render.js';
import type { Logger } from '../logger.js';
import type { RenderPool } from './render-pool.js';

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
  /** Does `work` on the event loop after the thread failed it (`failed`: the pool's rejection, or the thread's failure as data). */
  const onLoop = async <T>(work: () => T | Promise<T>, failed: unknown): Promise<T> => {
    const done = await work();
    // It did what the thread could not: the thread's failure was its own, not the content's.
    threadFailed(failed);
    return done;
  };
  return {
    async render(input) {
      const answer = await pool.answer({ kind: 'email', input }).catch((error: unknown) => ({ ok: false as const, error }));
      if (answer.ok) return answer.value;
      return onLoop(() => renderEmail(input), 'error' in answer ? answer.error : `${answer.name}: ${answer.message}`);
    },
    async compose(mail) {
      const answer = await pool.answer({ kind: 'compose', mail }).catch((error: unknown) => ({ ok: false as const, error }));
      if (!answer.ok) return onLoop(() => composeMessage(mail), 'error' in answer ? answer.error : `${answer.name}: ${answer.message}`);
      // A Buffer crosses the thread boundary as a plain Uint8Array (moved when it fills its own
      // memory, else copied: render-thread.ts).
      const { raw } = answer.value;
      return { ...answer.value, raw: Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength) };
    },
  };
}

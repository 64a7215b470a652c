import type { SendMailOptions } from 'nodemailer';
import { composeMessage, type Composed } from './compose.js';
import { renderEmail, type Rendered, type RenderInput } from './render.js';
import type { Logger } from '../logger.js';
import type { RenderPool } from './render-pool.js';

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
 * always did, and nothing else about an email changes because a thread was lost.
 */
export function offLoop(pool: RenderPool | undefined, logger?: Pick<Logger, 'warn'>): OffLoop {
  if (!pool) return { render: async (input) => renderEmail(input), compose: composeMessage };
  // The pool failed (not the content): said, since every message then costs the event loop.
  const lost = (error: unknown) => {
    logger?.warn({ err: error }, 'delivery thread failed; the message was rendered and built on the event loop');
    return undefined;
  };
  return {
    async render(input) {
      const answer = await pool.answer({ kind: 'email', input }).catch(lost);
      return answer?.ok ? answer.value : renderEmail(input);
    },
    async compose(mail) {
      const answer = await pool.answer({ kind: 'compose', mail }).catch(lost);
      if (!answer?.ok) return composeMessage(mail);
      // A Buffer crosses the thread boundary as a plain Uint8Array (its bytes copied once).
      const { raw } = answer.value;
      return { ...answer.value, raw: Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength) };
    },
  };
}

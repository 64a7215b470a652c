import { Piscina } from 'piscina';
import type { CampaignTemplate } from '../campaigns/content.js';
import { ServiceUnavailableError, ValidationError } from '../errors.js';
import type { Rendered, RenderInput } from './render.js';
import type { RenderAnswer, RenderTask } from './render-task.js';

export interface RenderPoolOptions {
  /** Threads at most; they start on first use and stop after a minute idle. */
  threads: number;
  /** A render taking longer is abandoned (its thread is replaced). */
  timeoutMs: number;
}

/**
 * Rendering off the API's event loop. The API renders in rare, interactive cases (a
 * campaign's test send); a body of the maximum size takes tens to hundreds of milliseconds
 * to render, during which one event loop would answer nobody else (tracking pixels,
 * unsubscribe pages, every other tenant). A small pool of worker threads (piscina: a
 * maintained pool with queueing, idle shutdown and abortable tasks) does it instead.
 * Workers render in their own processes and do not use it.
 */
export class RenderPool {
  private pool: Piscina | undefined;

  constructor(private readonly options: RenderPoolOptions) {}

  private get threads(): Piscina {
    this.pool ??= new Piscina({
      filename: new URL('./render-worker.mjs', import.meta.url).href,
      minThreads: 0,
      maxThreads: this.options.threads,
      idleTimeout: 60_000,
      // Beyond this many waiting renders the API answers 503 rather than queueing without end.
      maxQueue: this.options.threads * 32,
    });
    return this.pool;
  }

  email(input: RenderInput): Promise<Rendered> {
    return this.run({ kind: 'email', input }) as Promise<Rendered>;
  }

  campaign(campaign: Extract<RenderTask, { kind: 'campaign' }>['campaign']): Promise<CampaignTemplate> {
    return this.run({ kind: 'campaign', campaign }) as Promise<CampaignTemplate>;
  }

  private async run(task: RenderTask): Promise<Rendered | CampaignTemplate> {
    let answer: RenderAnswer;
    try {
      answer = (await this.threads.run(task, { signal: AbortSignal.timeout(this.options.timeoutMs) })) as RenderAnswer;
    } catch (error) {
      if ((error as Error).name === 'AbortError' || (error as Error).name === 'TimeoutError') {
        throw new ValidationError(`content: took longer than ${this.options.timeoutMs} ms to render`, [{ path: 'content', message: 'too long to render' }]);
      }
      if (/queue is at limit/i.test((error as Error).message)) throw new ServiceUnavailableError('Too many renders under way; try again shortly');
      throw error;
    }
    if (answer.ok) return answer.value;
    if (answer.name === 'ContentTooLargeError') throw new ValidationError(`content: ${answer.message}`, [{ path: 'content', message: answer.message }]);
    throw new Error(`render failed: ${answer.name}: ${answer.message}`);
  }

  async close(): Promise<void> {
    const pool = this.pool;
    this.pool = undefined;
    await pool?.destroy();
  }
}

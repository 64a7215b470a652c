import { Worker } from 'node:worker_threads';
import type { CampaignTemplate } from '../campaigns/content.js';
import { ServiceUnavailableError, ValidationError } from '../errors.js';
import type { Rendered, RenderInput } from './render.js';
import type { RenderAnswer, RenderTask } from './render-task.js';

export interface RenderPoolOptions {
  /** Threads at most; they start on first use and stop after IDLE_MS without work. */
  threads: number;
  /** A render taking longer is abandoned and its thread replaced. */
  timeoutMs: number;
  /** Renders waiting for a thread beyond this are refused (503) rather than queued without end. */
  maxQueue?: number;
}

const IDLE_MS = 60_000;
// Compiled (dist/*.js): the thread's compiled body. From the sources (tsx): a small .mjs
// entry that registers tsx in the thread first.
const WORKER_URL = import.meta.url.endsWith('.js') ? new URL('./render-thread.js', import.meta.url) : new URL('./render-worker.mjs', import.meta.url);

interface Job {
  task: RenderTask;
  resolve(answer: RenderAnswer): void;
  reject(error: Error): void;
}

interface Thread {
  worker: Worker;
  ready: Promise<void>;
  job?: Job & { timer: NodeJS.Timeout };
  idle?: NodeJS.Timeout;
}

/**
 * Rendering off the API's event loop. The API renders in rare, interactive cases (a
 * campaign's test send); a body of the maximum size takes tens to hundreds of milliseconds
 * to render, during which one event loop would answer nobody else (tracking pixels,
 * unsubscribe pages, every other tenant). A few worker threads do it instead, one render
 * each at a time. Hand-written (80 lines) because the maintained pools (piscina) pull a
 * native binary package. Workers render in their own processes and do not use it.
 */
export class RenderPool {
  private readonly threads = new Set<Thread>();
  private readonly queue: Job[] = [];
  private nextId = 0;
  private closed = false;

  constructor(private readonly options: RenderPoolOptions) {}

  email(input: RenderInput): Promise<Rendered> {
    return this.run({ kind: 'email', input }) as Promise<Rendered>;
  }

  campaign(campaign: Extract<RenderTask, { kind: 'campaign' }>['campaign']): Promise<CampaignTemplate> {
    return this.run({ kind: 'campaign', campaign }) as Promise<CampaignTemplate>;
  }

  private async run(task: RenderTask): Promise<Rendered | CampaignTemplate> {
    if (this.closed) throw new ServiceUnavailableError('The service is shutting down');
    if (this.queue.length >= (this.options.maxQueue ?? this.options.threads * 32)) {
      throw new ServiceUnavailableError('Too many renders under way; try again shortly');
    }
    const answer = await new Promise<RenderAnswer>((resolve, reject) => {
      this.queue.push({ task, resolve, reject });
      this.pump();
    });
    if (answer.ok) return answer.value;
    if (answer.name === 'ContentTooLargeError' || answer.name === 'ContentTooDeepError') throw new ValidationError(`content: ${answer.message}`, [{ path: 'content', message: answer.message }]);
    throw new Error(`render failed: ${answer.name}: ${answer.message}`);
  }

  private pump(): void {
    while (this.queue.length > 0) {
      let thread = [...this.threads].find((t) => !t.job);
      if (!thread && this.threads.size < this.options.threads) thread = this.spawn();
      if (!thread) return;
      this.start(thread, this.queue.shift()!);
    }
  }

  private spawn(): Thread {
    const worker = new Worker(WORKER_URL);
    worker.unref();
    let markReady!: () => void;
    const thread: Thread = { worker, ready: new Promise((resolve) => (markReady = resolve)) };
    worker.on('message', (message: { ready?: true; id?: number; answer?: RenderAnswer }) => {
      if (message.ready) return markReady();
      const job = thread.job;
      if (!job || message.answer === undefined) return;
      clearTimeout(job.timer);
      thread.job = undefined;
      job.resolve(message.answer);
      thread.idle = setTimeout(() => this.retire(thread), IDLE_MS).unref();
      this.pump();
    });
    worker.on('error', (error) => this.fail(thread, error));
    worker.on('exit', () => this.fail(thread, new Error('render thread exited')));
    this.threads.add(thread);
    return thread;
  }

  private start(thread: Thread, job: Job): void {
    clearTimeout(thread.idle);
    const timer = setTimeout(() => {
      this.fail(thread, new ValidationError(`content: took longer than ${this.options.timeoutMs} ms to render`, [{ path: 'content', message: 'too long to render' }]));
    }, this.options.timeoutMs);
    thread.job = { ...job, timer };
    const id = this.nextId++;
    // The timer runs from now, thread start included: a broken thread fails the request too.
    void thread.ready.then(() => thread.job?.timer === timer && thread.worker.postMessage({ id, task: job.task }));
  }

  /** A thread that failed or ran too long: its job fails, the thread is replaced on demand. */
  private fail(thread: Thread, error: Error): void {
    if (!this.threads.delete(thread)) return;
    const job = thread.job;
    thread.job = undefined;
    if (job) {
      clearTimeout(job.timer);
      job.reject(error);
    }
    clearTimeout(thread.idle);
    void thread.worker.terminate();
    this.pump();
  }

  private retire(thread: Thread): void {
    if (thread.job || !this.threads.delete(thread)) return;
    void thread.worker.terminate();
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0)) job.reject(new ServiceUnavailableError('The service is shutting down'));
    await Promise.all(
      [...this.threads].map(async (thread) => {
        this.threads.delete(thread);
        clearTimeout(thread.idle);
        if (thread.job) {
          clearTimeout(thread.job.timer);
          thread.job.reject(new ServiceUnavailableError('The service is shutting down'));
        }
        await thread.worker.terminate();
      }),
    );
  }
}

import { Worker } from 'node:worker_threads';
import type { SendMailOptions } from 'nodemailer';
import type { CampaignTemplate } from '../campaigns/content.js';
import { ServiceUnavailableError, ValidationError } from '../errors.js';
import type { Composed } from './compose.js';
import type { CampaignContentType } from '../db/entities/campaign.js';
import { ContentTooDeepError, type Rendered, type RenderInput } from './render.js';
import type { RenderAnswer, RenderTask } from './render-task.js';

export interface RenderPoolOptions {
  /** Threads at most; they start on first use and stop after IDLE_MS without work. */
  threads: number;
  /**
   * Tasks a thread is given before it answered the first (1: one at a time). More keep a
   * thread busy while its answers travel back: the delivery thread of a worker takes many.
   */
  tasksPerThread?: number;
  /** A task not answered this long after it was given to its thread is abandoned and the thread replaced. */
  timeoutMs: number;
  /** Tasks waiting for a thread beyond this are refused (503) rather than queued without end. */
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
  jobs: Map<number, Job & { timer: NodeJS.Timeout }>;
  idle?: NodeJS.Timeout;
}

/** A thread ended (it failed, or another task of it ran too long) before answering this task. */
class RenderThreadLostError extends Error {
  override name = 'RenderThreadLostError';
}

/**
 * Rendering off an event loop, in worker threads. The API renders in rare, interactive cases
 * (a campaign's test send); a body of the maximum size takes tens to hundreds of
 * milliseconds to render, during which one event loop would answer nobody else (tracking
 * pixels, unsubscribe pages, every other tenant): a few threads do it instead, one render
 * each at a time. A worker process renders and builds the messages it delivers in a thread
 * of its own (off-loop.ts), so that its event loop only talks to the relay,
 * Redis and PostgreSQL. Hand-written because the maintained pools (piscina) pull a native
 * binary package.
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

  /**
   * Whether a campaign's content links to `{{unsubscribe_url}}` (campaigns/content.ts): its
   * markdown rendered and its HTML parsed in a thread, off the API's event loop. Content nested
   * too deep throws ContentTooDeepError, as on the event loop.
   */
  async unsubscribeLink(contentType: CampaignContentType, content: unknown): Promise<boolean> {
    const answer = await this.submit({ kind: 'unsubscribe-link', contentType, content });
    if (answer.ok) return answer.value as boolean;
    if (answer.name === 'ContentTooDeepError') throw new ContentTooDeepError(answer.message);
    throw new Error(`render failed: ${answer.name}: ${answer.message}`);
  }

  /** The task's answer as the thread gave it (a failure as data), for a caller that redoes a failed task itself. */
  answer(task: { kind: 'email'; input: RenderInput }): Promise<RenderAnswer & ({ ok: false } | { value: Rendered })>;
  answer(task: { kind: 'compose'; mail: SendMailOptions }): Promise<RenderAnswer & ({ ok: false } | { value: Composed })>;
  answer(task: RenderTask): Promise<RenderAnswer> {
    return this.submit(task);
  }

  private async submit(task: RenderTask): Promise<RenderAnswer> {
    if (this.closed) throw new ServiceUnavailableError('The service is shutting down');
    if (this.queue.length >= (this.options.maxQueue ?? this.options.threads * this.perThread * 32)) {
      throw new ServiceUnavailableError('Too many renders under way; try again shortly');
    }
    return new Promise<RenderAnswer>((resolve, reject) => {
      this.queue.push({ task, resolve, reject });
      this.pump();
    });
  }

  private get perThread(): number {
    return this.options.tasksPerThread ?? 1;
  }

  private async run(task: RenderTask): Promise<Rendered | CampaignTemplate> {
    // Never the boolean of an unsubscribe-link task: that has its own method.
    const answer = await this.submit(task);
    if (answer.ok) return answer.value as Rendered | CampaignTemplate;
    if (answer.name === 'ContentTooLargeError' || answer.name === 'ContentTooDeepError') throw new ValidationError(`content: ${answer.message}`, [{ path: 'content', message: answer.message }]);
    throw new Error(`render failed: ${answer.name}: ${answer.message}`);
  }

  private pump(): void {
    while (this.queue.length > 0) {
      let thread: Thread | undefined;
      for (const t of this.threads) if (t.jobs.size < this.perThread && (!thread || t.jobs.size < thread.jobs.size)) thread = t;
      if ((!thread || thread.jobs.size > 0) && this.threads.size < this.options.threads) thread = this.spawn();
      if (!thread) return;
      this.start(thread, this.queue.shift()!);
    }
  }

  private spawn(): Thread {
    const worker = new Worker(WORKER_URL);
    worker.unref();
    let markReady!: () => void;
    const thread: Thread = { worker, ready: new Promise((resolve) => (markReady = resolve)), jobs: new Map() };
    worker.on('message', (message: { ready?: true; id?: number; answer?: RenderAnswer }) => {
      if (message.ready) return markReady();
      if (message.answer === undefined) return;
      const job = this.settle(thread, message.id!);
      if (!job) return;
      job.resolve(message.answer);
      this.pump();
    });
    worker.on('error', (error) => this.fail(thread, error));
    worker.on('exit', () => this.fail(thread, new RenderThreadLostError('render thread exited')));
    this.threads.add(thread);
    return thread;
  }

  private start(thread: Thread, job: Job): void {
    clearTimeout(thread.idle);
    const id = this.nextId++;
    const timer = setTimeout(() => {
      this.fail(thread, new RenderThreadLostError('another task of the render thread ran too long'), {
        id,
        error: new ValidationError(`content: took longer than ${this.options.timeoutMs} ms to render`, [{ path: 'content', message: 'too long to render' }]),
      });
    }, this.options.timeoutMs);
    thread.jobs.set(id, { ...job, timer });
    // The timer runs from now, thread start included: a broken thread fails the request too.
    void thread.ready.then(() => {
      if (!thread.jobs.has(id)) return;
      try {
        thread.worker.postMessage({ id, task: job.task });
      } catch (error) {
        // A task that cannot be copied to the thread (a value structured cloning refuses) fails
        // alone, at once: the thread and its other tasks go on.
        this.settle(thread, id)?.reject(error as Error);
        this.pump();
      }
    });
  }

  /** Takes task `id` off its thread (answered, or never sent); its job, unless already settled. */
  private settle(thread: Thread, id: number): Job | undefined {
    const job = thread.jobs.get(id);
    if (!job) return undefined;
    clearTimeout(job.timer);
    thread.jobs.delete(id);
    if (thread.jobs.size === 0) thread.idle = setTimeout(() => this.retire(thread), IDLE_MS).unref();
    return job;
  }

  /**
   * A thread that failed or ran too long: its tasks fail (the one that ran too long with
   * `culprit.error`), the thread is replaced on demand.
   */
  private fail(thread: Thread, error: Error, culprit?: { id: number; error: Error }): void {
    if (!this.threads.delete(thread)) return;
    for (const [id, job] of thread.jobs) {
      clearTimeout(job.timer);
      job.reject(id === culprit?.id ? culprit.error : error);
    }
    thread.jobs.clear();
    clearTimeout(thread.idle);
    void thread.worker.terminate();
    this.pump();
  }

  private retire(thread: Thread): void {
    if (thread.jobs.size > 0 || !this.threads.delete(thread)) return;
    void thread.worker.terminate();
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0)) job.reject(new ServiceUnavailableError('The service is shutting down'));
    await Promise.all(
      [...this.threads].map(async (thread) => {
        this.threads.delete(thread);
        clearTimeout(thread.idle);
        for (const job of thread.jobs.values()) {
          clearTimeout(job.timer);
          job.reject(new ServiceUnavailableError('The service is shutting down'));
        }
        thread.jobs.clear();
        await thread.worker.terminate();
      }),
    );
  }
}

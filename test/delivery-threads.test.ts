import { simpleParser } from 'mailparser';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { composeMessage } from '../src/shared/emails/compose.js';
import { offLoop } from '../src/shared/emails/off-loop.js';
import { renderEmail, type RenderInput } from '../src/shared/emails/render.js';
import { RenderPool } from '../src/shared/emails/render-pool.js';
import type { RenderTask } from '../src/shared/emails/render-task.js';
import { createRedis } from '../src/shared/redis.js';
import { emailSendProcessor } from '../src/workers/emails.js';
import { startWorkers } from '../src/workers/runner.js';
import { bearer, createOrg, createTestContext } from './helpers/context.js';
import { startSmtpSink } from './helpers/smtp-sink.js';
import { until } from './helpers/until.js';

// A worker renders and builds the mail it delivers in a thread of its own (DELIVERY_THREADS,
// docs/operations.md "Delivery threads"): the relay must get the same bytes as from the event
// loop, every answer must reach its own caller, and a thread that fails must cost no email.
const pools: RenderPool[] = [];
function pool(options: Partial<ConstructorParameters<typeof RenderPool>[0]> = {}): RenderPool {
  const made = new RenderPool({ threads: 1, tasksPerThread: 32, timeoutMs: 60_000, ...options });
  pools.push(made);
  return made;
}
afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.close()));
});

// Everything nodemailer would otherwise draw at random or read from the clock.
const mail = (i: number) => ({
  from: 'News <news@acme.test>',
  to: `reader${i}@example.com`,
  cc: ['copy@example.com'],
  subject: `Issue ${i}: caf\u00e9`,
  html: `<p>Hello ${i} \u2603</p>`,
  text: `Hello ${i}\r\n`,
  messageId: `<eml_${i}@acme.test>`,
  date: new Date('2026-12-07T10:00:00Z'),
  headers: { 'List-Unsubscribe': `<https://mail.acme.test/u/${i}>` },
  baseBoundary: 'a1b2c3d4e5f60718',
  disableFileAccess: true,
  disableUrlAccess: true,
});

const inputs: RenderInput[] = [
  { contentKind: 'markdown', content: '# Welcome\n\nA [link](https://acme.test) and **bold** text.', subject: 'Hi', preview: 'Read me' },
  { contentKind: 'html', content: '<h1>Receipt</h1><table><tr><td>Total</td><td>$5</td></tr></table>', subject: 'Receipt', text: null },
  { contentKind: 'tiptap', content: JSON.stringify({ type: 'doc', content: [{ type: 'paragraph', content: [{ type: 'text', text: 'From the editor' }] }] }), subject: 'Editor' },
];

describe('delivery threads', () => {
  it('build the bytes the event loop builds, envelope and Message-ID included', async () => {
    const threads = pool();
    for (const i of [1, 2]) {
      const [answer, onLoop] = await Promise.all([threads.answer({ kind: 'compose', mail: mail(i) }), composeMessage(mail(i))]);
      if (!answer.ok) throw new Error(`the thread refused: ${answer.message}`);
      expect(Buffer.from(answer.value.raw).equals(onLoop.raw)).toBe(true);
      expect(answer.value.envelope).toEqual({ from: 'news@acme.test', to: [`reader${i}@example.com`, 'copy@example.com'] });
      expect(answer.value.messageId).toBe(onLoop.messageId);
    }
    // Through offLoop, as the transport gets it: a Buffer.
    const composed = await offLoop(threads).compose(mail(1));
    expect(Buffer.isBuffer(composed.raw) && composed.raw.equals((await composeMessage(mail(1))).raw)).toBe(true);
  });

  it('render what the event loop renders (markdown, HTML, tiptap)', async () => {
    const threads = pool();
    for (const input of inputs) expect(await threads.answer({ kind: 'email', input })).toEqual({ ok: true, value: renderEmail(input) });
  });

  it('answer each of many tasks in flight at once to its own caller', async () => {
    const threads = offLoop(pool({ tasksPerThread: 8 }));
    const built = await Promise.all(Array.from({ length: 60 }, (_, i) => threads.compose(mail(i))));
    for (const [i, composed] of built.entries()) {
      const parsed = await simpleParser(composed.raw);
      expect(parsed.subject).toBe(`Issue ${i}: caf\u00e9`);
      expect(parsed.text?.trim()).toBe(`Hello ${i}`);
    }
  });

  it('refuse content with the error the event loop throws', async () => {
    const threads = pool();
    const deep: RenderInput = { contentKind: 'markdown', content: `${'>'.repeat(150)} deep`, subject: 's' };
    const onLoop = (() => {
      try {
        renderEmail(deep);
      } catch (error) {
        return error as Error;
      }
      throw new Error('the event loop rendered it');
    })();
    expect(await threads.answer({ kind: 'email', input: deep })).toEqual({ ok: false, name: onLoop.name, message: onLoop.message });
    // offLoop throws the event loop's own error (its class): the email fails with its reason.
    const thrown = await offLoop(threads)
      .render(deep)
      .then(
        () => undefined,
        (error: unknown) => error as Error,
      );
    expect(thrown).toBeInstanceOf(onLoop.constructor);
    expect(thrown!.message).toBe(onLoop.message);
  });

  it('cost no task when the thread is lost: what it held is done on the event loop, and said', async () => {
    // Every task outlives this timeout, so the pool ends its thread with all of them in it.
    const threads = pool({ timeoutMs: 1 });
    await expect(threads.answer({ kind: 'compose', mail: mail(0) })).rejects.toThrow();
    const warnings: { fields: { messages: number }; message: string }[] = [];
    const loop = offLoop(threads, { warn: ((fields: { messages: number }, message: string) => void warnings.push({ fields, message })) as never });
    const built = await Promise.all(Array.from({ length: 10 }, (_, i) => loop.compose(mail(i))));
    for (const [i, composed] of built.entries()) expect(composed.raw.equals((await composeMessage(mail(i))).raw)).toBe(true);
    expect(await loop.render(inputs[0]!)).toEqual(renderEmail(inputs[0]!));
    // Said once (a minute), not once a message.
    expect(warnings).toEqual([{ fields: expect.objectContaining({ messages: 1 }), message: 'delivery thread failed; the message was rendered and built on the event loop' }]);
  });

  it('fail a task that cannot be copied to the thread alone, at once: the thread goes on, and offLoop builds it on the event loop', async () => {
    const threads = pool();
    // A function: structured cloning refuses it (nodemailer ignores an option it does not know).
    const uncopyable = { ...mail(5), onBuilt: () => undefined };
    await expect(threads.answer({ kind: 'compose', mail: uncopyable })).rejects.toThrow(/could not be cloned/);
    const next = await threads.answer({ kind: 'compose', mail: mail(6) });
    expect(next.ok).toBe(true);
    const composed = await offLoop(threads, { warn: () => {} }).compose(uncopyable);
    expect(composed.raw.equals((await composeMessage(uncopyable)).raw)).toBe(true);
  });

  it('are not used at DELIVERY_THREADS=0: the event loop renders and builds', async () => {
    const loop = offLoop(undefined);
    expect((await loop.compose(mail(3))).raw.equals((await composeMessage(mail(3))).raw)).toBe(true);
    expect(await loop.render(inputs[1]!)).toEqual(renderEmail(inputs[1]!));
  });
});

describe('a worker with DELIVERY_THREADS=1', () => {
  it('hands the relay a message its thread rendered and built', async () => {
    const sink = await startSmtpSink();
    const ctx = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, DELIVERY_THREADS: '1' });
    const connection = createRedis(ctx.env.config.redisUrl, 'worker');
    try {
      const threads = ctx.services.deliveryThreads!;
      // What the thread answered, by task kind (a failure would be redone on the event loop).
      const answered: string[] = [];
      const answer = threads.answer.bind(threads) as (task: RenderTask) => ReturnType<RenderPool['answer']>;
      vi.spyOn(threads, 'answer').mockImplementation((async (task: RenderTask) => {
        const got = await answer(task);
        if (got.ok) answered.push(task.kind);
        return got;
      }) as never);
      const workers = await startWorkers(ctx.services, connection, [emailSendProcessor('emails', { reconcileGraceMs: 0 })]);
      try {
        const org = await createOrg(ctx.services);
        const sent = await ctx.app.inject({
          method: 'POST',
          url: '/api/v2/emails',
          headers: bearer(org.token),
          payload: { from: 'Acme <hello@acme.test>', to: 'jane@example.com', subject: 'Threaded', markdown: '# Hello from the thread' },
        });
        expect(sent.statusCode).toBe(200);
        const [raw] = await until(
          async () => sink.raw,
          (messages) => messages.length === 1,
        );
        const parsed = await simpleParser(raw!);
        expect(parsed.subject).toBe('Threaded');
        expect(parsed.html).toContain('Hello from the thread</h1>');
        expect(parsed.text?.trim()).toBe('Hello from the thread');
        expect(answered).toEqual(['email', 'compose']);
      } finally {
        await workers.close();
      }
    } finally {
      connection.disconnect();
      await ctx.close();
      await sink.close();
    }
  });
});

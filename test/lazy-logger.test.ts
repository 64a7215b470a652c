import { Writable } from 'node:stream';
import Fastify, { type FastifyBaseLogger } from 'fastify';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { lazyChildLogger } from '../src/api/plugins/lazy-logger.js';

describe('lazyChildLogger', () => {
  it('logs with the request id when used, and makes no child logger otherwise', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const stream = new Writable({
      write(chunk, _encoding, done) {
        lines.push(JSON.parse(String(chunk)));
        done();
      },
    });
    const logger = pino({ level: 'info' }, stream);
    let children = 0;
    const child = logger.child;
    logger.child = function (this: typeof logger, ...args: Parameters<typeof child>) {
      children++;
      return child.apply(this, args);
    } as typeof logger.child;
    const app = Fastify({ loggerInstance: logger as FastifyBaseLogger, disableRequestLogging: true });
    // As the app's error handler does for a 5xx.
    app.setErrorHandler(async (error, request, reply) => {
      request.log.error({ err: error }, 'request failed');
      return reply.code(500).send('failed');
    });
    app.get('/quiet', { childLoggerFactory: lazyChildLogger }, async () => 'ok');
    app.get('/loud', { childLoggerFactory: lazyChildLogger }, async (request) => {
      request.log.warn({ detail: 1 }, 'something');
      request.log.child({ step: 'inner' }).info('nested');
      return 'ok';
    });
    app.get('/fails', { childLoggerFactory: lazyChildLogger }, async () => {
      throw new Error('boom');
    });

    await app.ready();
    const before = children;
    expect((await app.inject({ url: '/quiet' })).statusCode).toBe(200);
    expect(children).toBe(before);
    expect((await app.inject({ url: '/loud', headers: { 'request-id': 'x' } })).statusCode).toBe(200);
    expect((await app.inject({ url: '/fails' })).statusCode).toBe(500);
    await app.close();

    const loud = lines.filter((l) => l.msg === 'something' || l.msg === 'nested');
    expect(loud).toHaveLength(2);
    expect(loud[0]).toMatchObject({ level: 40, detail: 1, reqId: expect.any(String) });
    expect(loud[1]).toMatchObject({ step: 'inner', reqId: loud[0]!.reqId });
    const failed = lines.find((l) => l.level === 50);
    expect(failed).toMatchObject({ reqId: expect.any(String), err: { message: 'boom' } });
    expect(failed!.reqId).not.toBe(loud[0]!.reqId);
  });
});

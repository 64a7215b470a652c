import { writeFile } from 'node:fs/promises';
import http from 'node:http';
import { createServer, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedis } from '../src/shared/redis.js';
import { defineProcessor, startWorkers } from '../src/workers/runner.js';
import { createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { runService, type ServiceProcess } from './helpers/process.js';
import { freePort, waitFor } from './helpers/outages.js';
import { openDialog } from './helpers/smtp-dialog.js';
import { selfSignedCertificate } from './helpers/tls.js';

let ctx: TestContext;
let token: string;

beforeAll(async () => {
  ctx = await createTestContext();
  ({ token } = await createOrg(ctx.services));
});
afterAll(async () => ctx?.close());

describe('worker runner', () => {
  it('finishes the active job when closed, and leaves waiting jobs queued', async () => {
    const seen: Array<{ event: string; jobId?: string; hasEm?: boolean }> = [];
    const slow = defineProcessor({
      queue: 'maintenance',
      concurrency: 1,
      handlers: {
        'purge-expired': async (payload, job) => {
          seen.push({ event: 'start', jobId: job.job.id, hasEm: job.em !== ctx.services.orm.em && typeof job.em.find === 'function' });
          await sleep(1000);
          seen.push({ event: 'end', jobId: job.job.id });
          return { payload, done: true };
        },
      },
    });
    const connection = createRedis(ctx.env.config.redisUrl, 'worker');
    try {
      const running = await startWorkers(ctx.services, connection, [slow]);
      expect(running.queues).toEqual(['maintenance']);
      await ctx.services.producer.add('maintenance', { name: 'purge-expired', data: {}, jobId: 'slow-1' });
      await expect.poll(() => seen.length, { timeout: 10_000, interval: 20 }).toBe(1);
      await ctx.services.producer.add('maintenance', { name: 'purge-expired', data: {}, jobId: 'slow-2' });

      const closing = Date.now();
      await running.close();
      expect(Date.now() - closing).toBeGreaterThan(500);
      expect(seen).toEqual([
        { event: 'start', jobId: 'slow-1', hasEm: true },
        { event: 'end', jobId: 'slow-1' },
      ]);
      const queue = ctx.services.producer.queue('maintenance');
      const finished = await queue.getJob('slow-1');
      expect(await finished?.getState()).toBe('completed');
      expect(finished?.returnvalue).toEqual({ payload: {}, done: true });
      expect(await (await queue.getJob('slow-2'))?.getState()).toBe('waiting');
    } finally {
      connection.disconnect();
    }
  });

  it('is started only once every worker is connected: closed at once, it leaves no unhandled rejection', async () => {
    // A stop right after "workers started" (a loaded machine, a quick Ctrl-C): a worker whose
    // blocking connection was still being set up rejected a command of it on close, unhandled,
    // and the process exited 1 instead of 0.
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => void unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    const noop = defineProcessor({ queue: 'maintenance', handlers: { 'purge-expired': async () => null } });
    try {
      for (let i = 0; i < 40; i++) {
        const connection = createRedis(ctx.env.config.redisUrl, 'worker');
        connection.on('error', () => {});
        const running = await startWorkers(ctx.services, connection, [noop]);
        // The signal comes a few milliseconds after the log line.
        await sleep(i % 5);
        await running.close();
        connection.disconnect();
      }
      await sleep(200);
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });

  it('refuses an unknown queue in WORKER_QUEUES, naming it', async () => {
    const connection = createRedis(ctx.env.config.redisUrl, 'worker');
    try {
      const noop = defineProcessor({ queue: 'maintenance', handlers: { 'purge-expired': async () => null } });
      await expect(startWorkers(ctx.services, connection, [noop], ['maintenance', 'nope'])).rejects.toThrow(/WORKER_QUEUES.*nope/);
    } finally {
      connection.disconnect();
    }
  });
});

function request(port: number, path: string, options: http.RequestOptions = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, ...options }, (res) => {
      let body = '';
      res.on('data', (chunk: Buffer) => (body += chunk.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function startMain(): Promise<{ proc: ServiceProcess; port: number }> {
  // `npm start` runs `node dist/main.js`; PORT=0 lets the OS choose, and the log says which.
  const proc = runService('src/main.ts', [], { ...ctx.env.env, PORT: '0', LOG_LEVEL: 'info' });
  const match = await proc.waitFor(/mailroom is running on http:\/\/127\.0\.0\.1:(\d+)/);
  return { proc, port: Number(match[1]) };
}

describe('a stop that never finishes (docs: "a stop still unfinished after 25 s exits 1")', () => {
  it('exits 1 at the deadline, saying so', async () => {
    const proc = runService('test/fixtures/stuck-stop.ts', [], { LOG_LEVEL: 'info' });
    try {
      await proc.waitFor(/ready/);
      const signalled = Date.now();
      proc.child.kill('SIGTERM');
      expect(await proc.exited).toBe(1);
      expect(Date.now() - signalled).toBeLessThan(10_000);
      expect(proc.stdout()).toMatch(/shutdown did not finish in time/);
    } finally {
      proc.kill();
    }
  });
});

describe('npm start (src/main.ts)', () => {
  it('with Redis unreachable, answers 503 on /readyz while its workers wait, and exits on SIGTERM', async () => {
    // A port where nothing listens.
    const closed = await new Promise<number>((resolve) => {
      const server = createServer();
      server.listen(0, '127.0.0.1', () => {
        const { port } = server.address() as { port: number };
        server.close(() => resolve(port));
      });
    });
    const proc = runService('src/main.ts', [], { ...ctx.env.env, PORT: '0', LOG_LEVEL: 'info', REDIS_URL: `redis://127.0.0.1:${closed}` });
    try {
      const port = Number((await proc.waitFor(/API listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]);
      const ready = await request(port, '/readyz');
      expect(ready.status).toBe(503);
      expect(ready.body).toContain('redis');
      expect(proc.stdout()).not.toContain('mailroom is running');
      proc.child.kill('SIGTERM');
      expect(await proc.exited).toBe(0);
    } finally {
      proc.kill();
    }
  });

  it('serves /healthz and exits 0 on SIGINT', async () => {
    const { proc, port } = await startMain();
    try {
      expect(await request(port, '/healthz')).toEqual({ status: 200, body: '{"status":"ok"}' });
      // SMTP submission runs in the same process (docs/smtp.md).
      const smtpPort = Number(/SMTP submission on 127\.0\.0\.1:(\d+)/.exec(proc.stdout())?.[1]);
      const dialog = await openDialog(smtpPort);
      expect(dialog.greeting).toMatch(/^220 .*ESMTP/);
      dialog.close();
      expect((await request(port, '/readyz')).status).toBe(200);
      proc.child.kill('SIGINT');
      expect(await proc.exited).toBe(0);
      expect(proc.stdout()).toMatch(/"signal":"SIGINT".*shutting down/);
    } finally {
      proc.kill();
    }
  });

  it('on SIGTERM completes the request in flight, takes no new one, and exits 0', async () => {
    const { proc, port } = await startMain();
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const auth = { authorization: `Bearer ${token}` };
      expect((await request(port, '/api/v2/tokens', { headers: auth, agent })).status).toBe(200);

      // A request whose body is still arriving when the signal comes.
      const body = JSON.stringify({ name: 'in flight', preset: 'app' });
      let answered = false;
      let req!: http.ClientRequest;
      const inFlight = new Promise<{ status: number; body: string; connection?: string }>((resolve, reject) => {
        req = http.request(
          {
            host: '127.0.0.1',
            port,
            method: 'POST',
            path: '/api/v2/tokens',
            agent,
            headers: { ...auth, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
          },
          (res) => {
            let text = '';
            res.on('data', (chunk: Buffer) => (text += chunk.toString()));
            res.on('end', () => {
              answered = true;
              resolve({ status: res.statusCode ?? 0, body: text, connection: res.headers.connection });
            });
          },
        );
        req.on('error', reject);
      });
      req.write(body.slice(0, 10));
      await sleep(300);
      proc.child.kill('SIGTERM');
      await proc.waitFor(/shutting down/);
      await sleep(300);
      // Still running and holding the request; new connections are refused.
      expect(answered).toBe(false);
      await expect(request(port, '/healthz', { agent: false })).rejects.toThrow(/ECONNREFUSED/);
      req.end(body.slice(10));

      const res = await inFlight;
      expect(res.status).toBe(200);
      expect(JSON.parse(res.body)).toMatchObject({ name: 'in flight', reused: false });
      // Its keep-alive connection is closed, so the process does not wait for it.
      expect(res.connection).toBe('close');
      const answeredAt = Date.now();
      expect(await proc.exited).toBe(0);
      expect(Date.now() - answeredAt).toBeLessThan(3_000);

      // The token it minted was committed.
      const listed = await ctx.app.inject({ url: '/api/v2/tokens?limit=100', headers: auth });
      expect(listed.json().data.map((t: { name: string }) => t.name)).toContain('in flight');
    } finally {
      agent.destroy();
      proc.kill();
    }
  });
});

describe('npm run start:worker (src/workers/main.ts)', () => {
  it('starts the queues of WORKER_QUEUES and exits 0 on SIGTERM', async () => {
    const proc = runService('src/workers/main.ts', [], { ...ctx.env.env, LOG_LEVEL: 'info', WORKER_QUEUES: 'maintenance' });
    try {
      await proc.waitFor(/"queues":\["maintenance"\].*workers started/);
      proc.child.kill('SIGTERM');
      expect(await proc.exited, proc.stdout() + proc.stderr()).toBe(0);
    } finally {
      proc.kill();
    }
  });

  it('exits 1 with one line naming the setting when a port is in use or a file it names cannot be read', async () => {
    const { keyFile, certFile } = await selfSignedCertificate('startup');
    // A file that is there and readable but holds no PEM at all.
    const notPem = `${certFile}.txt`;
    await writeFile(notPem, 'not a certificate\n');
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const { port } = taken.address() as { port: number };
    try {
      const cases: Array<[string, Record<string, string>, RegExp]> = [
        ['src/api/server.ts', { PORT: String(port) }, new RegExp(`^mailroom: PORT: 127\\.0\\.0\\.1:${port} is already in use`)],
        ['src/inbound/main.ts', { INBOUND_SMTP_PORT: String(port) }, /^mailroom: INBOUND_SMTP_PORT: .* is already in use/],
        ['src/inbound/main.ts', { INBOUND_SMTP_PORT: '0', INBOUND_TLS_KEY: '/nonexistent/key.pem', INBOUND_TLS_CERT: '/nonexistent/cert.pem' }, /^mailroom: INBOUND_TLS_KEY: cannot read \/nonexistent\/key\.pem \(ENOENT\)/],
        ['src/smtp/main.ts', { SMTP_SUBMISSION_PORT: String(port) }, /^mailroom: SMTP_SUBMISSION_PORT: .* is already in use/],
        ['src/smtp/main.ts', { SMTP_SUBMISSION_PORT: '0', SMTP_TLS_CERT_FILE: '/nonexistent/cert.pem', SMTP_TLS_KEY_FILE: '/nonexistent/key.pem' }, /^mailroom: SMTP_TLS_KEY_FILE: cannot read/],
        // Files that are there but are not a certificate and its key (swapped, not PEM).
        ['src/smtp/main.ts', { SMTP_SUBMISSION_PORT: '0', SMTP_TLS_CERT_FILE: keyFile, SMTP_TLS_KEY_FILE: certFile }, /^mailroom: SMTP_TLS_CERT_FILE, SMTP_TLS_KEY_FILE: not a PEM certificate and its private key/],
        ['src/inbound/main.ts', { INBOUND_SMTP_PORT: '0', INBOUND_TLS_KEY: notPem, INBOUND_TLS_CERT: notPem }, /^mailroom: INBOUND_TLS_CERT, INBOUND_TLS_KEY: not a PEM certificate/],
        ['src/smtp/main.ts', { SMTP_SUBMISSION_PORT: '0', WORKER_METRICS_PORT: String(port) }, /^mailroom: WORKER_METRICS_PORT: .* is already in use/],
      ];
      for (const [entry, env, message] of cases) {
        const proc = runService(entry, [], { ...ctx.env.env, ...env });
        expect(await proc.exited, entry).toBe(1);
        expect(proc.stderr(), entry).toMatch(message);
        expect(proc.stderr(), entry).not.toMatch(/\n\s+at /);
      }
    } finally {
      taken.close();
    }
  });

  it('a worker refuses an outbox directory it cannot write, naming MAIL_OUTBOX_DIR', async () => {
    const proc = runService('src/workers/main.ts', [], { ...ctx.env.env, MAIL_TRANSPORT: 'file', MAIL_OUTBOX_DIR: '/etc/passwd/outbox' });
    expect(await proc.exited).toBe(1);
    expect(proc.stderr()).toMatch(/^mailroom: MAIL_OUTBOX_DIR: cannot create or write the directory \/etc\/passwd\/outbox \(ENOTDIR\)/);
  });

  it('a worker started while Redis is unreachable answers /healthz, and /readyz 503, while it waits', async () => {
    const [metricsPort, nothing] = [await freePort(), await freePort()];
    const proc = runService('src/workers/main.ts', [], { ...ctx.env.env, REDIS_URL: `redis://127.0.0.1:${nothing}`, WORKER_METRICS_PORT: String(metricsPort) });
    try {
      const health = await waitFor('worker /healthz', async () => (await fetch(`http://127.0.0.1:${metricsPort}/healthz`).catch(() => undefined))?.status, 20_000);
      expect(health).toBe(200);
      const ready = await fetch(`http://127.0.0.1:${metricsPort}/readyz`);
      expect(ready.status).toBe(503);
      expect(ready.headers.get('retry-after')).toBe('5');
      expect(await ready.json()).toMatchObject({ name: 'service_unavailable', checks: { redis: 'down' } });
    } finally {
      proc.kill();
    }
  });

  it('exits 1 naming an unknown queue in WORKER_QUEUES', async () => {
    const proc = runService('src/workers/main.ts', [], { ...ctx.env.env, WORKER_QUEUES: 'maintenance,nope' });
    expect(await proc.exited).toBe(1);
    expect(proc.stdout() + proc.stderr()).toMatch(/WORKER_QUEUES.*nope/);
  });
});

describe('a signal during start-up', () => {
  it('is not fatal to `npm start` while its workers start: it stops gracefully and exits 0', async () => {
    // The signal comes once the listeners are up and the workers are starting: the services
    // they start on (the queues' Redis connection) are closed under them by the stop.
    const proc = runService('src/main.ts', [], { ...ctx.env.env, PORT: '0', LOG_LEVEL: 'info' });
    try {
      await proc.waitFor(/SMTP submission on/);
      proc.child.kill('SIGTERM');
      expect(await proc.exited, proc.stdout() + proc.stderr()).toBe(0);
      expect(proc.stdout()).toMatch(/shutting down[\s\S]*stopped/);
      expect(proc.stderr()).not.toMatch(/Error/);
    } finally {
      proc.kill();
    }
  });

  it('is not fatal: the API stops gracefully once started', async () => {
    // A "Redis" that accepts connections and never answers holds start-up for its 3 s wait.
    const sockets: Socket[] = [];
    const silent = createServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const { port } = silent.address() as { port: number };
    const proc = runService('src/api/server.ts', [], {
      ...ctx.env.env,
      PORT: '0',
      LOG_LEVEL: 'info',
      REDIS_URL: `redis://127.0.0.1:${port}`,
      SECRET_KEY: '', // unset: start-up logs a warning first, which tells the test it has begun
    });
    try {
      await proc.waitFor(/SECRET_KEY is not set/);
      await sleep(500);
      proc.child.kill('SIGTERM');
      expect(await proc.exited).toBe(0);
      expect(proc.stdout()).toMatch(/signal received while starting[\s\S]*shutting down/);
    } finally {
      proc.kill();
      sockets.forEach((socket) => socket.destroy());
      await new Promise((resolve) => silent.close(resolve));
    }
  });
});

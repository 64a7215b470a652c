import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A TCP port nobody listens on right now. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export async function waitFor<T>(what: string, check: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs = 10_000, intervalMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined && value !== false) return value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/**
 * A redis-server of the test's own on a free loopback port, so the test can take it away
 * without touching the machine's Redis. `stop('kill')` loses the data (as a crash of a
 * Redis without persistence would); `stop('save')` writes it to disk first, so `start()`
 * brings the same data back on the same port.
 */
export class TestRedis {
  private process: ChildProcess | undefined;

  private constructor(
    readonly port: number,
    private readonly dir: string,
  ) {}

  static async start(): Promise<TestRedis> {
    const redis = new TestRedis(await freePort(), await mkdtemp(join(tmpdir(), 'mailroom-redis-')));
    await redis.start();
    return redis;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    const child = spawn(
      'redis-server',
      ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', this.dir, '--dbfilename', 'dump.rdb'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    this.process = child;
    await new Promise<void>((resolve, reject) => {
      let output = '';
      const onData = (chunk: Buffer) => {
        output += chunk.toString();
        if (output.includes('Ready to accept connections')) {
          child.stdout?.off('data', onData);
          child.stdout?.resume();
          resolve();
        }
      };
      child.stdout?.on('data', onData);
      child.stderr?.resume();
      child.once('error', reject);
      child.once('exit', (code) => reject(new Error(`redis-server exited with ${code}: ${output}`)));
    });
  }

  /** Stops the server: 'kill' is SIGKILL (data lost), 'save' is SHUTDOWN SAVE. */
  async stop(how: 'kill' | 'save'): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    if (how === 'kill') {
      child.kill('SIGKILL');
    } else {
      const cli = spawn('redis-cli', ['-p', String(this.port), 'shutdown', 'save'], { stdio: 'ignore' });
      await new Promise((resolve) => cli.once('exit', resolve));
    }
    await exited;
    this.process = undefined;
  }

  /** SIGSTOP / SIGCONT: the server keeps its connections but answers nothing (a hung host). */
  freeze(frozen: boolean): void {
    this.process?.kill(frozen ? 'SIGSTOP' : 'SIGCONT');
  }

  async dispose(): Promise<void> {
    this.freeze(false);
    await this.stop('kill');
    await rm(this.dir, { recursive: true, force: true });
  }
}

/**
 * A TCP proxy to a real server (here the machine's PostgreSQL). `cut()` drops every
 * connection and stops listening, so the port is closed exactly as if the server were gone;
 * `restore()` listens again on the same port. The real server is never touched.
 */
export class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();

  private constructor(
    readonly port: number,
    private readonly targetHost: string,
    private readonly targetPort: number,
  ) {}

  static async start(targetHost: string, targetPort: number): Promise<TcpProxy> {
    const proxy = new TcpProxy(await freePort(), targetHost, targetPort);
    await proxy.restore();
    return proxy;
  }

  /** Listens again, taking connections and never answering them (a host that hangs). */
  async hang(): Promise<void> {
    await this.cut();
    await this.listen((client) => {
      this.sockets.add(client);
      client.on('close', () => this.sockets.delete(client));
      client.on('error', () => client.destroy());
    });
  }

  async restore(): Promise<void> {
    if (this.server) return;
    await this.listen((client) => {
      const upstream = connect(this.targetPort, this.targetHost);
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on('close', () => this.sockets.delete(socket));
        socket.on('error', () => {
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream).pipe(client);
    });
  }

  private async listen(onConnection: (client: Socket) => void): Promise<void> {
    const server = createServer(onConnection);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.server = server;
  }

  async cut(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const socket of this.sockets) socket.destroy();
    this.sockets.clear();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

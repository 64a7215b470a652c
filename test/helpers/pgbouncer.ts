import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './outages.js';

export const PGBOUNCER = '/usr/sbin/pgbouncer';

export interface PgBouncer {
  /** `url` with its host and port replaced by PgBouncer's. */
  through(url: string): string;
  stop(): Promise<void>;
}

/**
 * A PgBouncer of the test's own on a loopback port, in front of the shared PostgreSQL, in
 * transaction pooling mode with `serverConnections` server connections per database (few, so
 * that client sessions keep moving between them).
 */
export async function startPgBouncer(options: { serverConnections: number; /** Only these databases (as a pooler of one application lists them); every one by default. */ databases?: string[] }): Promise<PgBouncer> {
  const dir = await mkdtemp(join(tmpdir(), 'mailroom-pgbouncer-'));
  // PgBouncer refuses to run as root: it runs as the postgres user, which must read these.
  await chmod(dir, 0o755);
  const port = await freePort();
  await writeFile(join(dir, 'users.txt'), '"postgres" ""\n');
  await writeFile(
    join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      ...(options.databases ? options.databases.map((name) => `${name} = host=127.0.0.1 port=5432 dbname=${name}`) : ['* = host=127.0.0.1 port=5432']),
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${join(dir, 'users.txt')}`,
      'pool_mode = transaction',
      `default_pool_size = ${options.serverConnections}`,
      'max_client_conn = 500',
      '',
    ].join('\n'),
  );
  const args = process.getuid?.() === 0 ? ['-u', 'postgres', join(dir, 'pgbouncer.ini')] : [join(dir, 'pgbouncer.ini')];
  const child: ChildProcess = spawn(PGBOUNCER, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`pgbouncer exited: ${stderr}`);
    const open = await new Promise<boolean>((resolve) => {
      const socket = createConnection({ host: '127.0.0.1', port }, () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (open) break;
    if (Date.now() > deadline) throw new Error(`pgbouncer did not listen: ${stderr}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    through(url) {
      const u = new URL(url);
      u.hostname = '127.0.0.1';
      u.port = String(port);
      return u.toString();
    },
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGINT');
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}

import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type DKIM from 'nodemailer/lib/dkim/index.js';

/**
 * DKIM signing off the event loop: RSA-2048 signing is most of a campaign email's CPU
 * (about 1.2 ms of 1.7 ms), and one event loop uses one core. Messages are signed by
 * nodemailer's own DKIM signer (the same bytes as signing inline) in `threads` worker
 * threads; the send path awaits the signed message and hands it to the SMTP pool.
 *
 * A tiny inline worker (eval) rather than a worker file, so it runs the same under tsx, from
 * compiled output and in tests. A thread that dies fails its messages (the send is retried
 * like any build error of a transient kind) and is replaced.
 */
export interface DkimSigner {
  sign(raw: Buffer, key: DKIM.SingleKeyOptions): Promise<Buffer>;
  close(): Promise<void>;
}

const require = createRequire(import.meta.url);

function workerSource(): string {
  const dkimPath = JSON.stringify(require.resolve('nodemailer/lib/dkim/index.js'));
  return `
    const { parentPort } = require('node:worker_threads');
    const DKIM = require(${dkimPath});
    parentPort.on('message', ({ id, raw, key }) => {
      const chunks = [];
      const stream = new DKIM(key).sign(Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength));
      stream.on('data', (chunk) => chunks.push(chunk));
      stream.on('end', () => parentPort.postMessage({ id, signed: Buffer.concat(chunks) }));
      stream.on('error', (error) => parentPort.postMessage({ id, error: String(error && error.message || error) }));
    });`;
}

/** Threads for a machine: one core is left to the event loop that sends (at least one thread). */
export function defaultDkimThreads(): number {
  return Math.max(1, availableParallelism() - 1);
}

export function createDkimSigner(threads: number): DkimSigner {
  type Pending = { resolve: (signed: Buffer) => void; reject: (error: Error) => void };
  const pending = new Map<number, Pending>();
  const owner = new Map<number, Worker>();
  let nextId = 0;
  let closed = false;
  const workers: { worker: Worker; load: number }[] = [];

  const spawn = (slot: number) => {
    const worker = new Worker(workerSource(), { eval: true });
    // The pool must not keep a process alive that is otherwise done.
    worker.unref();
    const entry = { worker, load: 0 };
    workers[slot] = entry;
    worker.on('message', (m: { id: number; signed?: Uint8Array; error?: string }) => {
      const p = pending.get(m.id);
      pending.delete(m.id);
      owner.delete(m.id);
      entry.load--;
      if (!p) return;
      if (m.error !== undefined || !m.signed) p.reject(Object.assign(new Error(`DKIM signing failed: ${m.error}`), { code: 'EMESSAGE' }));
      else p.resolve(Buffer.from(m.signed.buffer, m.signed.byteOffset, m.signed.byteLength));
    });
    worker.on('error', () => {});
    worker.on('exit', () => {
      // Its messages fail (retried by their jobs); a new thread takes the slot.
      for (const [id, w] of owner) {
        if (w !== worker) continue;
        pending.get(id)?.reject(Object.assign(new Error('the DKIM signing thread stopped'), { code: 'ECONNECTION' }));
        pending.delete(id);
        owner.delete(id);
      }
      if (!closed) spawn(slot);
    });
  };
  for (let i = 0; i < threads; i++) spawn(i);

  return {
    sign(raw, key) {
      if (closed) return Promise.reject(new Error('the DKIM signer is closed'));
      // The least loaded thread.
      let entry = workers[0]!;
      for (const w of workers) if (w.load < entry.load) entry = w;
      const id = nextId++;
      entry.load++;
      return new Promise<Buffer>((resolve, reject) => {
        pending.set(id, { resolve, reject });
        owner.set(id, entry.worker);
        entry.worker.postMessage({ id, raw, key });
      });
    },
    async close() {
      closed = true;
      await Promise.all(workers.map((w) => w.worker.terminate()));
    },
  };
}

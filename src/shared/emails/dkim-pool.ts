import { createPrivateKey, type KeyObject } from 'node:crypto';
import { createRequire } from 'node:module';
import { LRUCache } from 'lru-cache';
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
/** Parsed private keys a thread keeps (one a sending domain in use). */
const MAX_PARSED_KEYS = 256;

function workerSource(): string {
  const dkimPath = JSON.stringify(require.resolve('nodemailer/lib/dkim/index.js'));
  return `
    const { parentPort } = require('node:worker_threads');
    const { createPrivateKey } = require('node:crypto');
    const DKIM = require(${dkimPath});
    // Parsed keys by PEM: parsing a PEM costs twice the RSA signature itself.
    const parsed = new Map();
    const keyObject = (pem) => {
      let key = parsed.get(pem);
      if (key === undefined) {
        if (parsed.size >= ${MAX_PARSED_KEYS}) parsed.delete(parsed.keys().next().value);
        // A key crypto cannot read goes to nodemailer as it is (it sends such mail unsigned).
        try {
          key = createPrivateKey(pem);
        } catch {
          key = pem;
        }
        parsed.set(pem, key);
      }
      return key;
    };
    parentPort.on('message', ({ id, raw, key }) => {
      const chunks = [];
      let stream;
      try {
        stream = new DKIM({ ...key, privateKey: typeof key.privateKey === 'string' ? keyObject(key.privateKey) : key.privateKey }).sign(Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength));
      } catch (error) {
        return parentPort.postMessage({ id, error: String(error && error.message || error) });
      }
      stream.on('data', (chunk) => chunks.push(chunk));
      stream.on('end', () => parentPort.postMessage({ id, signed: Buffer.concat(chunks) }));
      stream.on('error', (error) => parentPort.postMessage({ id, error: String(error && error.message || error) }));
    });`;
}

// A memo of a pure transform (the same PEM gives the same key whatever the app or config):
// sharing it across the process is harmless, like the threads' own copies.
const parsedKeys = new LRUCache<string, KeyObject>({ max: MAX_PARSED_KEYS });

/**
 * The key options with the PEM parsed once (for signing on the event loop,
 * `DKIM_SIGNING_THREADS=0`): nodemailer hands its `privateKey` to crypto's `Sign#sign`, which
 * takes a KeyObject as well as a PEM, and parsing the PEM for every message cost twice the RSA
 * signature itself (540 of 810 us on the project's machine).
 */
export function withParsedKey(key: DKIM.SingleKeyOptions): DKIM.SingleKeyOptions {
  if (typeof key.privateKey !== 'string') return key;
  let parsed = parsedKeys.get(key.privateKey);
  if (parsed === undefined) {
    // A key crypto cannot read goes to nodemailer as it is (it sends such mail unsigned).
    try {
      parsed = createPrivateKey(key.privateKey);
    } catch {
      return key;
    }
    parsedKeys.set(key.privateKey, parsed);
  }
  // Typed by nodemailer as a PEM string; crypto.Sign#sign takes either.
  return { ...key, privateKey: parsed as unknown as string };
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

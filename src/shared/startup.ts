import type { EventEmitter } from 'node:events';
import { constants } from 'node:fs';
import { access, mkdir, readFile } from 'node:fs/promises';
import { createSecureContext } from 'node:tls';

/**
 * A start-up problem that names the setting to change (docs/operations.md: a bad value stops the
 * process with a message naming the variable). The process prints it as one line and exits 1
 * (boot.ts), like a configuration error, with no stack trace.
 */
export class StartupError extends Error {
  override name = 'StartupError';
}

/** An I/O error as a message says it: its code (ENOENT, EACCES, ...), else its text. */
const reasonOf = (error: unknown) => (error as NodeJS.ErrnoException).code ?? (error as Error).message;

/** A file a setting names (a TLS key or certificate), read at start-up. */
export async function readSettingFile(file: string, variable: string): Promise<Buffer> {
  try {
    return await readFile(file);
  } catch (error) {
    throw new StartupError(`${variable}: cannot read ${file} (${reasonOf(error)})`);
  }
}

/**
 * A TLS key and certificate that settings name, read and checked at start-up: a file that is
 * not PEM, a key and a certificate swapped or of different pairs would otherwise fail deep in
 * the listener with OpenSSL's words and a stack trace, naming no setting.
 */
export async function readTlsSettings(key: { file: string; variable: string }, cert: { file: string; variable: string }): Promise<{ key: Buffer; cert: Buffer }> {
  const pair = { key: await readSettingFile(key.file, key.variable), cert: await readSettingFile(cert.file, cert.variable) };
  try {
    createSecureContext(pair);
  } catch (error) {
    throw new StartupError(`${cert.variable}, ${key.variable}: not a PEM certificate and its private key (${(error as Error).message})`);
  }
  return pair;
}

/** A directory a setting names, created when missing, that this process must be able to write. */
export async function ensureWritableDirectory(directory: string, variable: string): Promise<void> {
  try {
    await mkdir(directory, { recursive: true });
    await access(directory, constants.W_OK);
  } catch (error) {
    throw new StartupError(`${variable}: cannot create or write the directory ${directory} (${reasonOf(error)})`);
  }
}

/**
 * Listens with `listen`, turning the errors a setting causes into a StartupError naming it:
 * a port in use or not allowed, a host that does not resolve or is not this machine's.
 */
export async function listenOrExplain<T>(listen: () => Promise<T>, host: { variable: string; value: string }, port: { variable: string; value: number }): Promise<T> {
  try {
    return await listen();
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE') throw new StartupError(`${port.variable}: ${host.value}:${port.value} is already in use by another process`);
    if (code === 'EACCES') throw new StartupError(`${port.variable}: not allowed to listen on port ${port.value} (a port below 1024 needs privileges)`);
    if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') throw new StartupError(`${host.variable}: the host ${host.value} does not resolve`);
    if (code === 'EADDRNOTAVAIL') throw new StartupError(`${host.variable}: ${host.value} is not an address of this machine`);
    throw error;
  }
}

/** A listener of the smtp-server package (its `listen` takes a callback; errors come on its net server). */
interface CallbackListener {
  server: EventEmitter;
  listen(port: number, host: string, callback: () => void): unknown;
}

/** `listener.listen(port, host)` as a promise, with listenOrExplain's messages. */
export function listenOn(listener: CallbackListener, host: { variable: string; value: string }, port: { variable: string; value: number }): Promise<void> {
  const listen = () =>
    new Promise<void>((resolve, reject) => {
      listener.server.once('error', reject);
      listener.listen(port.value, host.value, () => {
        listener.server.off('error', reject);
        resolve();
      });
    });
  return listenOrExplain(listen, host, port);
}

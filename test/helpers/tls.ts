import { execFile } from 'node:child_process';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

/** A self-signed certificate for localhost, made by the `openssl` command: the PEM files' paths. */
export async function selfSignedCertificate(prefix: string): Promise<{ keyFile: string; certFile: string }> {
  const dir = await mkdtemp(join(tmpdir(), `mailroom-${prefix}-`));
  const keyFile = join(dir, 'key.pem');
  const certFile = join(dir, 'cert.pem');
  await promisify(execFile)('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=localhost', '-keyout', keyFile, '-out', certFile]);
  return { keyFile, certFile };
}

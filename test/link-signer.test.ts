import { createHmac } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { LinkSigner } from '../src/shared/crypto.js';

// The definition of a link's MAC; links already sent must keep verifying.
const reference = (secret: string, purpose: string, payload: string) =>
  createHmac('sha256', `mailroom:link:${purpose}:${secret}`).update(payload).digest().subarray(0, 16).toString('base64url');

describe('LinkSigner', () => {
  const secrets = ['short', 'bench-secret-key-bench-secret-key-0123456789', 'é'.repeat(40), 'k'.repeat(200)];
  const values = ['eml_01JDXYZ', 'eml_1 0 https://shop.test/é?a=1&b=2', 'u'.repeat(3_000), 'ü'.repeat(900)];

  it('signs with HMAC-SHA256 under the purpose key, truncated to 16 bytes', () => {
    for (const secret of secrets) {
      const signer = new LinkSigner(secret);
      for (const purpose of ['track-open', 'track-click', 'unsubscribe']) {
        for (const value of values) {
          const token = signer.sign(purpose, value);
          const [payload, mac] = token.split('.');
          expect(mac).toBe(reference(secret, purpose, payload!));
          expect(signer.verify(purpose, token)).toBe(value);
        }
      }
    }
  });

  it('refuses altered, truncated, cross-purpose and foreign tokens', () => {
    const signer = new LinkSigner('bench-secret-key-bench-secret-key-0123456789');
    const token = signer.sign('track-click', 'eml_1 0 https://shop.test/');
    const [payload, mac] = token.split('.') as [string, string];
    expect(signer.verify('track-open', token)).toBeNull();
    expect(new LinkSigner('another-secret').verify('track-click', token)).toBeNull();
    expect(signer.verify('track-click', `${payload}.${mac.slice(0, -1)}${mac.endsWith('A') ? 'B' : 'A'}`)).toBeNull();
    expect(signer.verify('track-click', `${payload}.${mac.slice(0, -1)}`)).toBeNull();
    expect(signer.verify('track-click', `${payload}x.${mac}`)).toBeNull();
    expect(signer.verify('track-click', `${payload}.${mac}.${mac}`)).toBeNull();
    expect(signer.verify('track-click', `.${mac}`)).toBeNull();
  });
});

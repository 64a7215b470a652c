import { describe, expect, it } from 'vitest';
import { requestHash } from '../src/shared/emails/service.js';

// Idempotency-Key rows store this fingerprint for 24 h: a change of serialization would make
// every retry made across a deploy answer 409. The value was computed by the hand-written
// stableJson that safe-stable-stringify replaced.
describe('requestHash', () => {
  const body = {
    to: ['a@example.com'],
    from: 'Zoë <z@example.com>',
    subject: 'hi "there" \u2028',
    html: '<p>x</p>',
    tags: [{ name: 'b', value: 1 }, { value: null, name: 'a' }],
    headers: { 'X-B': '2', 'X-A': '1' },
    text: undefined,
    n: 1.5e21,
  };

  it('is the fingerprint stored before the serializer changed', () => {
    expect(requestHash('POST /emails', body)).toBe('1c1cad0495c6714a43a1048fa83b249ad931ec3f2a9f645875712e522f120f1d');
  });

  it('does not depend on key order or on undefined members', () => {
    const reordered = { n: 1.5e21, headers: { 'X-A': '1', 'X-B': '2' }, tags: body.tags, html: body.html, subject: body.subject, from: body.from, to: body.to };
    expect(requestHash('POST /emails', reordered)).toBe(requestHash('POST /emails', body));
  });
});

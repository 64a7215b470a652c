import { hash } from 'argon2';
import { describe, expect, it } from 'vitest';
import { DECOY_HASH } from '../src/shared/users/service.js';

describe('the decoy password hash', () => {
  it("costs what a user's hash costs: the parameters of argon2's hash", async () => {
    const params = (encoded: string) => encoded.split('$').slice(1, 4).join('$');
    expect(params(DECOY_HASH)).toBe(params(await hash('any password')));
  });
});

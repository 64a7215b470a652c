/**
 * Polls `probe` until `ok` holds for its value, and returns that value; throws with the last
 * value after `timeoutMs`. The one polling helper of the tests.
 */
export async function until<T>(probe: () => Promise<T>, ok: (value: T) => boolean, timeoutMs = 15_000): Promise<T> {
  const started = Date.now();
  for (;;) {
    const value = await probe();
    if (ok(value)) return value;
    if (Date.now() - started > timeoutMs) throw new Error(`timed out waiting; last value ${String(JSON.stringify(value)).slice(0, 500)}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

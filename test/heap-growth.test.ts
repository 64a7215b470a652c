import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { ROOT } from './helpers/process.js';

const run = promisify(execFile);

/** Peak RSS (bytes) of the fixture's allocation pattern with HEAP_GROWING_PERCENT = `percent`. */
async function peakRss(percent: number): Promise<number> {
  const env = { ...process.env, HEAP_GROWING_PERCENT: String(percent), SECRET_KEY: 'heap-growth-test-secret-key-0123456789', LOG_LEVEL: 'silent' };
  const { stdout } = await run(process.execPath, ['--import', 'tsx', 'test/fixtures/heap-growth.ts'], { cwd: ROOT, env });
  return Number(stdout.split(' ')[0]);
}

// The service sets V8's heap growing factor at boot (HEAP_GROWING_PERCENT, default 100): the
// same allocations must then peak well below V8's own heuristic (0), which lets garbage pile
// up to about three times the live heap between major collections.
describe('heap growth set at boot', () => {
  it('keeps the peak RSS of a busy process below what V8 alone lets it reach', async () => {
    // One after the other: V8's own factor follows the speed it measures of the mutator and of
    // its collections, which two processes sharing the cores would both slow down.
    const own = await peakRss(0);
    const limited = await peakRss(100);
    expect(limited).toBeLessThan(own * 0.85);
  }, 30_000);
});

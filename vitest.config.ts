import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    // Files run in parallel, each in its own database and Redis prefix (test/helpers).
    pool: 'forks',
    maxWorkers: 3,
    // Generous: several tests start processes of the service, slow on a loaded 2-core machine.
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 30_000,
  },
});

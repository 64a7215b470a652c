import type { Services } from './container.js';
import { ping } from './db/queries.js';

export type DependencyState = 'up' | 'down';
export interface DependencyStatus {
  postgres: DependencyState;
  redis: DependencyState;
}

// A probe that gets no answer in this long counts as down: /readyz and the workers' poll
// must answer quickly while a dependency hangs, not wait for TCP to give up.
const PROBE_TIMEOUT_MS = 2_000;

async function probe(check: () => Promise<unknown>): Promise<DependencyState> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      check(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error('timeout')), PROBE_TIMEOUT_MS);
      }),
    ]);
    return 'up';
  } catch {
    return 'down';
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Whether PostgreSQL and Redis answer now, both probed at once. Redis is probed on the
 * fail-fast connection, so a dead Redis is reported at once instead of queued.
 */
export async function dependencyStatus(services: Pick<Services, 'orm' | 'redis'>): Promise<DependencyStatus> {
  const [postgres, redis] = await Promise.all([
    probe(() => ping(services.orm.em.fork())),
    probe(() => services.redis.ping()),
  ]);
  return { postgres, redis };
}

export function downDependencies(status: DependencyStatus): string[] {
  return Object.entries(status)
    .filter(([, state]) => state === 'down')
    .map(([name]) => name);
}

import type { EntityManager } from '@mikro-orm/postgresql';
import { redisKey, type Services } from '../container.js';
import type { VerificationDeps } from './verify.js';

export { verifyEmail, type VerificationResult } from './verify.js';
export {
  recordCatchAllDomain,
  recordComplaint,
  recordHardBounce,
  recordMailboxFull,
  recordMailboxNotFound,
  recordProven,
  recordSuppression,
} from './history.js';

const blockedSets = new WeakMap<Services, ReadonlySet<string>>();

/** What verifyEmail needs, from the process's services and the caller's EntityManager fork. */
export function verificationDeps(services: Services, em: EntityManager): VerificationDeps {
  let blocked = blockedSets.get(services);
  if (!blocked) {
    blocked = new Set(services.config.verifyBlockedDomains);
    blockedSets.set(services, blocked);
  }
  return {
    em,
    redis: services.redis,
    dns: services.dns,
    clock: services.clock,
    routingKey: (domain) => redisKey(services.config, 'verify', 'route', domain),
    blockedDomains: blocked,
  };
}

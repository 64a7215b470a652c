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

/**
 * What verifyEmail needs. The store batches statements across concurrent calls, so there is
 * one per process, in the services container (`services.verification`).
 */
export function verificationDeps(services: Services): VerificationDeps {
  const own = services.verification;
  return {
    store: own.store,
    redis: services.redis,
    dns: services.dns,
    clock: services.clock,
    routingKey: (domain) => redisKey(services.config, 'verify', 'route', domain),
    blockedDomains: own.blocked,
    localRouting: own.localRouting,
    logger: services.logger,
  };
}

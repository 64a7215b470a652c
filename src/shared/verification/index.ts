import { redisKey, type Services } from '../container.js';
import { LocalRoutingCache } from './routing.js';
import { VerificationStore } from './store.js';
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

interface PerProcess {
  blocked: ReadonlySet<string>;
  store: VerificationStore;
  localRouting: LocalRoutingCache;
}
const perProcess = new WeakMap<Services, PerProcess>();

/**
 * What verifyEmail needs. The store batches statements across concurrent calls, so there is
 * one per process (per Services), on a fork of its own used only for raw statements.
 */
export function verificationDeps(services: Services): VerificationDeps {
  let own = perProcess.get(services);
  if (!own) {
    own = {
      blocked: new Set(services.config.verifyBlockedDomains),
      store: VerificationStore.forEntityManager(services.orm.em.fork()),
      localRouting: new LocalRoutingCache(),
    };
    perProcess.set(services, own);
  }
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

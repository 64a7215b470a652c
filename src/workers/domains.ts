import pLimit from 'p-limit';
import { checkDomain, dueDomainIds } from '../shared/domains/verification.js';
import { defineProcessor } from './runner.js';

// One sweep checks at most this many due domains (the rest wait for the next tick), this many at a time.
const SWEEP_BATCH = 500;
const SWEEP_CONCURRENCY = 8;
// The sweep ticks four times as often as the shortest re-check interval (a minute): a
// domain due at T is checked by T+15 s, so a record published just after a check is seen
// within about 75 s. A tick with nothing due is one indexed query.
export const SWEEP_EVERY_MS = 15_000;

/**
 * Sending-domain verification (docs/domains.md "Verification"). Lookups go through `dns.fresh`: a
 * record the user has just published must not be hidden by a cached NXDOMAIN or an old
 * answer. The fresh answers still refresh the shared cache.
 */
export const domainsProcessor = defineProcessor({
  queue: 'domains',
  concurrency: 4,
  handlers: {
    check: async ({ domainId }, ctx) => {
      const domain = await checkDomain(ctx.em, ctx.services.dns.fresh, domainId, ctx.services.clock());
      ctx.log.debug({ domainId, status: domain?.status }, 'domain checked');
      return { status: domain?.status ?? null };
    },
    'recheck-due': async (_payload, ctx) => {
      const ids = await dueDomainIds(ctx.em, ctx.services.clock(), SWEEP_BATCH);
      const limit = pLimit(SWEEP_CONCURRENCY);
      // A fork per domain: concurrent checks never share an EntityManager.
      await Promise.all(
        ids.map((id) =>
          limit(async () => {
            try {
              await checkDomain(ctx.services.orm.em.fork(), ctx.services.dns.fresh, id, ctx.services.clock());
            } catch (error) {
              ctx.log.warn({ err: error, domainId: id }, 'domain re-check failed');
            }
          }),
        ),
      );
      return { checked: ids.length };
    },
  },
  async onStart(services) {
    // Idempotent by id, so every worker process may upsert it (no `repeat` option).
    await services.producer.queue('domains').upsertJobScheduler('domains-recheck', { every: SWEEP_EVERY_MS }, { name: 'recheck-due', data: {} });
  },
});

import { DelayedError } from 'bullmq';
import type { Services } from '../shared/container.js';
import { activeCampaigns, completeCampaign, enqueueCompletion, runFanOut, type FanOutDeps } from '../shared/campaigns/fanout.js';
import { enqueueFanOut } from '../shared/campaigns/service.js';
import { emailSendProcessor } from './emails.js';
import { defineProcessor, type JobContext } from './runner.js';

// How often a SENDING campaign whose fan-out is done checks whether every email is out.
const COMPLETE_POLL_MS = 1_000;
// Re-enqueue the jobs of SCHEDULED/SENDING campaigns that Redis lost (docs/campaigns.md "Fan-out").
const RECONCILE_EVERY_MS = 30_000;

function fanOutDeps(ctx: JobContext): FanOutDeps {
  const s: Services = ctx.services;
  return {
    producer: s.producer,
    logger: ctx.log,
    metrics: s.metrics,
    pageSize: s.config.campaignFanoutPage,
    now: s.clock,
    policy: s.config,
  };
}

/**
 * Queue `campaigns`: `fan-out` (jobId = campaign id, delayed until scheduledAt) starts a
 * SCHEDULED campaign and writes its emails page by page; `complete` moves it to SENT/FAILED
 * when no email is pending; `reconcile` re-adds lost jobs. A killed worker's fan-out job is
 * taken over after its lock expires (5 s) and resumes from the campaign's cursor.
 */
export const campaignsProcessor = defineProcessor({
  queue: 'campaigns',
  concurrency: 4,
  // A short lock: a killed worker's fan-out is taken over within about 7 s.
  workerOptions: { lockDuration: 5_000, stalledInterval: 2_000, maxStalledCount: 10 },
  handlers: {
    'fan-out': async (payload, ctx) => ({ result: await runFanOut(ctx.em, fanOutDeps(ctx), payload.campaignId) }),
    complete: async (payload, ctx) => {
      const result = await completeCampaign(ctx.em, ctx.services.metrics, payload.campaignId);
      if (result === 'pending' && ctx.job.token) {
        await ctx.job.moveToDelayed(Date.now() + COMPLETE_POLL_MS, ctx.job.token);
        throw new DelayedError();
      }
      if (result !== 'pending' && result !== 'gone') ctx.log.info({ campaignId: payload.campaignId, status: result }, 'campaign finished');
      return { result };
    },
    reconcile: async (_payload, ctx) => {
      const queue = ctx.services.producer.queue('campaigns');
      let requeued = 0;
      for (const c of await activeCampaigns(ctx.em)) {
        const jobId = c.status === 'SENDING' && c.fanout_done ? `complete-${c.id}` : c.id;
        if (await queue.getJob(jobId)) continue;
        requeued++;
        if (jobId === c.id) await enqueueFanOut({ producer: ctx.services.producer, logger: ctx.log }, c.id, c.scheduled_at ? new Date(c.scheduled_at) : new Date(), ctx.services.clock());
        else await enqueueCompletion({ producer: ctx.services.producer, logger: ctx.log }, c.id, 0);
      }
      if (requeued > 0) ctx.log.warn({ requeued }, 're-enqueued campaign jobs that were missing');
      return { requeued };
    },
  },
  async onStart(services) {
    await services.producer.queue('campaigns').upsertJobScheduler('campaigns-reconcile', { every: RECONCILE_EVERY_MS }, { name: 'reconcile', data: {} });
  },
});

/** Campaign mail is handed over by the same send processor, from its own queue. */
export const campaignEmailsProcessor = emailSendProcessor('campaign-emails');

import { z } from 'zod';
import { workflowJobs } from '../subscribers/workflow-events.js';

/**
 * Every queue of the service: queue name -> job name -> zod payload. The producer and the
 * workers both type and validate against this table, so a job that one side cannot read is
 * never enqueued. Each feature adds its queue here.
 */
export const queueRegistry = {
  maintenance: {
    // Periodic housekeeping that belongs to no single feature; scheduled by the workers.
    'purge-expired': z.object({}),
  },
  domains: {
    // Checks one sending domain's DNS records now (after POST /domains/{d}/verify).
    check: z.object({ domainId: z.string() }),
    // Every minute (job scheduler): checks the PENDING/VERIFIED domains that are due.
    'recheck-due': z.object({}),
  },
  subscribers: {
    // Double opt-in: build the confirmation email of a PENDING_CONFIRMATION subscriber.
    // owedSince: the confirmation record's time (ms), which names the job.
    'send-confirmation': z.object({ subscriberId: z.string(), owedSince: z.number().int() }),
    // Scheduled: re-enqueue the confirmations still owed whose job Redis lost.
    reconcile: z.object({}),
  },
  // Subscriber change events (triggerWorkflows), one job per change; see subscribers/workflow-events.ts.
  workflows: workflowJobs,
  emails: {
    // One job per email, jobId = the email id. `throttled` counts provider throttle answers.
    send: z.object({ emailId: z.string(), throttled: z.number().int().min(0).optional() }),
    // A batch accepted by the API: the worker fans it out into one `send` job per email.
    'send-batch': z.object({ emailIds: z.array(z.string()).min(1).max(1000) }),
    // Scheduled: re-enqueue queued emails whose job is missing; fail stale hand-overs.
    reconcile: z.object({}),
    // Scheduled: forget Idempotency-Key rows older than 24 h.
    'purge-idempotency-keys': z.object({}),
  },
  // Campaign mail: the same jobs as `emails`, on a queue of its own so that transactional
  // mail (on `emails`) overtakes a campaign of any size.
  'campaign-emails': {
    send: z.object({ emailId: z.string(), throttled: z.number().int().min(0).optional() }),
    'send-batch': z.object({ emailIds: z.array(z.string()).min(1).max(1000) }),
    reconcile: z.object({}),
    'purge-idempotency-keys': z.object({}),
  },
  campaigns: {
    // jobId = the campaign id, delayed until scheduledAt: SCHEDULED -> SENDING, then the
    // fan-out by keyset pages (resumable from the campaign's cursor).
    'fan-out': z.object({ campaignId: z.string() }),
    // jobId = complete-<campaign id>: SENDING -> SENT/FAILED once no email is pending.
    complete: z.object({ campaignId: z.string() }),
    // Scheduled: re-enqueue the jobs of SCHEDULED/SENDING campaigns that Redis lost.
    reconcile: z.object({}),
  },
  // Bounces and complaints received by the inbound SMTP listener (src/shared/bounces).
  inbound: {
    // jobId = the first report id: reads the reports stored within 100 ms and applies them.
    process: z.object({ reportIds: z.array(z.string()).min(1).max(1000) }),
    // Scheduled: re-enqueue reports whose job Redis lost; purge old read reports.
    reconcile: z.object({}),
  },
  webhooks: {
    // Delivers the due messages of one endpoint (jobId = deliver-<endpoint id>): one job per
    // endpoint, so a slow endpoint holds only its own slot.
    deliver: z.object({ endpointId: z.string() }),
    // Every second (job scheduler): the dispatcher and reconciler of the outbox; enqueues
    // `deliver` for every endpoint with a due, unclaimed message.
    dispatch: z.object({}),
  },
} as const satisfies Record<string, Record<string, z.ZodType>>;

export type QueueRegistry = typeof queueRegistry;
export type QueueName = keyof QueueRegistry;
export type JobName<Q extends QueueName> = keyof QueueRegistry[Q] & string;
export type JobPayload<Q extends QueueName, J extends JobName<Q>> = z.infer<QueueRegistry[Q][J]>;

export const QUEUE_NAMES = Object.keys(queueRegistry) as QueueName[];

export function isQueueName(name: string): name is QueueName {
  return Object.hasOwn(queueRegistry, name);
}

export function parsePayload<Q extends QueueName>(queue: Q, job: string, data: unknown): unknown {
  const schema = (queueRegistry[queue] as Record<string, z.ZodType>)[job];
  if (!schema) throw new Error(`queue ${queue} has no job named ${job}`);
  return schema.parse(data);
}

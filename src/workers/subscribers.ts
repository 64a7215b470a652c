import { sendingPolicyProblem } from '../shared/domains/sending-policy.js';
import { createEmails, requestHash } from '../shared/emails/service.js';
import { buildConfirmationEmail, confirmationJob, confirmationJobId, confirmationToken, confirmationUrl } from '../shared/subscribers/confirmation.js';
import { deleteConfirmationDue, selectOverdueConfirmations, selectSenderEmails, selectSubscriberWithOrganization } from '../shared/subscribers/queries.js';
import { defineProcessor, type JobContext } from './runner.js';

/** The confirmation email of one subscriber, ready for the transactional send pipeline. */
export interface ConfirmationMessage {
  organizationId: string;
  subscriberId: string;
  to: string;
  subject: string;
  html: string;
}

/**
 * The From of the organization's own mail: its oldest sender that the sending policy allows
 * (docs/security.md: never a domain the organization has not proven when
 * ALLOW_UNVERIFIED_DOMAINS=false), else SYSTEM_FROM (by default `no-reply@` the host of
 * PUBLIC_URL; docs/audience.md). Named after the organization either way.
 */
async function confirmationFrom(ctx: JobContext, organizationId: string, organizationName: string): Promise<string> {
  const senders = await selectSenderEmails(ctx.em, organizationId);
  let allowed: string | undefined;
  for (const sender of senders) {
    if (!(await sendingPolicyProblem(ctx.em, ctx.services.config, organizationId, sender))) {
      allowed = sender;
      break;
    }
  }
  const address = allowed ?? ctx.services.config.systemFrom;
  // A display name is a quoted string: drop what would need escaping rather than escape it.
  const name = organizationName.replace(/["\\\r\n]/g, '').trim();
  return name ? `"${name}" <${address}>` : address;
}

/**
 * The one place where the confirmation email leaves the audience module: it goes through
 * the transactional pipeline like any other email. The idempotency key is the confirmation
 * record (its job id), so a retried job answers the email already created instead of sending
 * a second one, and a subscriber pending again gets a new email.
 */
export async function handOffConfirmationEmail(
  ctx: JobContext,
  message: ConfirmationMessage & { from: string; key: string },
): Promise<{ handedOff: boolean; emailId: string }> {
  const input = {
    organizationId: message.organizationId,
    source: 'api' as const,
    subscriberId: message.subscriberId,
    from: message.from,
    to: message.to,
    subject: message.subject,
    contentKind: 'html' as const,
    content: message.html,
    tags: [{ name: 'category', value: 'double_opt_in' }],
  };
  const created = await createEmails(ctx.em, { producer: ctx.services.producer, logger: ctx.log }, [input], {
    idempotency: { key: message.key, requestHash: requestHash('subscribers/confirmation', input) },
  });
  return { handedOff: true, emailId: created.ids[0]! };
}

/** How often the reconciler runs, and how old an owed confirmation must be for it. */
const RECONCILE_EVERY_MS = 60_000;
const RECONCILE_GRACE_MS = 60_000;
const RECONCILE_PAGE = 1_000;

/**
 * The confirmations owed for longer than the grace period whose job is missing (Redis lost
 * it, or failed when the write enqueued it) or completed without the record being cleared
 * (a worker killed in between): enqueued again. The job is idempotent, so at worst it runs
 * twice; the email's idempotency key keeps it to one email.
 */
async function reconcileConfirmations(ctx: JobContext): Promise<number> {
  const queue = ctx.services.producer.queue('subscribers');
  const before = new Date(ctx.services.clock().getTime() - RECONCILE_GRACE_MS);
  const owed = await selectOverdueConfirmations(ctx.em, before, RECONCILE_PAGE);
  const missing: Array<{ subscriberId: string; owedSince: Date }> = [];
  // The jobs and their states read together (the commands overlap on the connection), not a
  // round trip after another for each of up to a page of confirmations.
  const jobs = await Promise.all(owed.map(({ subscriberId, owedSince }) => queue.getJob(confirmationJobId(subscriberId, owedSince.getTime()))));
  const states = await Promise.all(jobs.map((job) => job?.getState()));
  for (const [i, record] of owed.entries()) {
    const job = jobs[i];
    if (job) {
      const state = states[i];
      if (state === 'failed') {
        // Its attempts spent on an error that is not an outage: the failed job is the
        // operator's record, and it is not retried every minute. The confirmation is no
        // longer owed: left in place, such records would fill the reconciler's page (the
        // oldest first) and hide newer confirmations whose job Redis lost.
        await deleteConfirmationDue(ctx.em, record.subscriberId, record.owedSince);
        continue;
      }
      // Waiting, delayed or running: it will clear the record.
      if (state !== 'completed') continue;
      await job.remove();
    }
    missing.push(record);
  }
  if (missing.length > 0) {
    await ctx.services.producer.addBulk('subscribers', missing.map((r) => confirmationJob(r.subscriberId, r.owedSince)));
  }
  return missing.length;
}

export const subscribersProcessor = defineProcessor({
  queue: 'subscribers',
  handlers: {
    // Idempotent: a subscriber no longer pending (confirmed, unsubscribed, gone) gets nothing,
    // and the confirmation is no longer owed. Only the job of the confirmation owed now sends:
    // one whose record a later write replaced (the address changed, or the subscriber became
    // pending again, before it ran) leaves the email to the later record's job, or the
    // subscriber would get two; one whose record is gone has handed its email over already.
    'send-confirmation': async ({ subscriberId, owedSince }, ctx) => {
      const started = ctx.services.clock();
      const subscriber = await selectSubscriberWithOrganization(ctx.em, subscriberId);
      if (!subscriber || subscriber.status !== 'PENDING_CONFIRMATION') {
        await deleteConfirmationDue(ctx.em, subscriberId, started);
        return { skipped: true };
      }
      if (subscriber.owed_since?.getTime() !== owedSince) return { skipped: true };
      const url = confirmationUrl(ctx.services.config.publicUrl, confirmationToken(ctx.services.signer, subscriber));
      const email = buildConfirmationEmail({
        organization: { name: subscriber.organization_name },
        subscriber: { email: subscriber.email, name: subscriber.name },
        confirmUrl: url,
      });
      const message: ConfirmationMessage = {
        organizationId: subscriber.organization_id,
        subscriberId: subscriber.id,
        to: subscriber.email,
        ...email,
      };
      const from = await confirmationFrom(ctx, subscriber.organization_id, subscriber.organization_name);
      const { handedOff, emailId } = await handOffConfirmationEmail(ctx, { ...message, from, key: confirmationJobId(subscriberId, owedSince) });
      // The email row is committed: from here the emails reconciler protects it. Only this
      // record: a later one (written meanwhile) keeps its own job.
      await deleteConfirmationDue(ctx.em, subscriberId, new Date(owedSince));
      return { skipped: false, handedOff, emailId, message };
    },
    reconcile: async (_payload, ctx) => {
      const requeued = await reconcileConfirmations(ctx);
      if (requeued > 0) ctx.log.warn({ requeued }, 're-enqueued confirmation emails whose job was missing');
      return { requeued };
    },
  },
  async onStart(services) {
    await services.producer.queue('subscribers').upsertJobScheduler('subscribers-reconcile', { every: RECONCILE_EVERY_MS }, { name: 'reconcile', data: {} });
  },
});

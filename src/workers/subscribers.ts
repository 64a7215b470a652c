import { buildConfirmationEmail, confirmationToken, confirmationUrl } from '../shared/subscribers/confirmation.js';
import type { SubscriberRow } from '../shared/subscribers/rows.js';
import { defineProcessor, type JobContext } from './runner.js';

/** The confirmation email of one subscriber, ready for the transactional send pipeline. */
export interface ConfirmationMessage {
  organizationId: string;
  subscriberId: string;
  to: string;
  subject: string;
  markdown: string;
}

/**
 * THE one place where the confirmation email leaves the audience module. The transactional
 * send pipeline (src/shared/emails/service.ts, `createEmails(em, inputs)`) is wired here
 * when it is merged: create one email for `message.to` with `message.subject` and
 * `message.markdown` in `message.organizationId`. Until then the message is only built
 * and logged, and returned as the job's result.
 */
export async function handOffConfirmationEmail(ctx: JobContext, message: ConfirmationMessage): Promise<{ handedOff: boolean }> {
  ctx.log.info({ subscriberId: message.subscriberId }, 'confirmation email built; no send pipeline is wired yet');
  return { handedOff: false };
}

export const subscribersProcessor = defineProcessor({
  queue: 'subscribers',
  handlers: {
    // Idempotent: a subscriber no longer pending (confirmed, unsubscribed, gone) gets nothing.
    'send-confirmation': async ({ subscriberId }, ctx) => {
      const found = (await ctx.em.execute(
        `select s.*, o.name as organization_name from subscribers s join organizations o on o.id = s.organization_id where s.id = ?`,
        [subscriberId],
      )) as Array<SubscriberRow & { organization_name: string }>;
      const subscriber = found[0];
      if (!subscriber || subscriber.status !== 'PENDING_CONFIRMATION') return { skipped: true };
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
      const { handedOff } = await handOffConfirmationEmail(ctx, message);
      return { skipped: false, handedOff, message };
    },
  },
});

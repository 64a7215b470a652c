import { sendingPolicyProblem } from '../shared/domains/sending-policy.js';
import { createEmails, requestHash } from '../shared/emails/service.js';
import { buildConfirmationEmail, confirmationToken, confirmationUrl } from '../shared/subscribers/confirmation.js';
import { selectSenderEmails, selectSubscriberWithOrganization } from '../shared/subscribers/queries.js';
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
 * the transactional pipeline like any other email. The idempotency key is the subscriber,
 * so a retried job answers the email already created instead of sending a second one.
 */
export async function handOffConfirmationEmail(
  ctx: JobContext,
  message: ConfirmationMessage & { from: string },
): Promise<{ handedOff: boolean; emailId: string }> {
  const input = {
    organizationId: message.organizationId,
    source: 'api' as const,
    subscriberId: message.subscriberId,
    from: message.from,
    to: message.to,
    subject: message.subject,
    contentKind: 'markdown' as const,
    content: message.markdown,
    tags: [{ name: 'category', value: 'double_opt_in' }],
  };
  const key = `confirm-${message.subscriberId}`;
  const created = await createEmails(ctx.em, { producer: ctx.services.producer, logger: ctx.log }, [input], {
    idempotency: { key, requestHash: requestHash('subscribers/confirmation', input) },
  });
  return { handedOff: true, emailId: created.ids[0]! };
}

export const subscribersProcessor = defineProcessor({
  queue: 'subscribers',
  handlers: {
    // Idempotent: a subscriber no longer pending (confirmed, unsubscribed, gone) gets nothing.
    'send-confirmation': async ({ subscriberId }, ctx) => {
      const subscriber = await selectSubscriberWithOrganization(ctx.em, subscriberId);
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
      const from = await confirmationFrom(ctx, subscriber.organization_id, subscriber.organization_name);
      const { handedOff, emailId } = await handOffConfirmationEmail(ctx, { ...message, from });
      return { skipped: false, handedOff, emailId, message };
    },
  },
});

import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { AppError, NotFoundError } from '../../shared/errors.js';
import { applyDeliveryFeedback, type DeliveryFeedback } from '../../shared/outcomes/provider-events.js';
import { mailgunFeedback, verifyMailgun } from '../../shared/providers/mailgun.js';
import { postmarkAuthorized, postmarkFeedback } from '../../shared/providers/postmark.js';
import { sendgridFeedback, sendgridKey, verifySendgrid } from '../../shared/providers/sendgrid.js';
import { sesFeedback } from '../../shared/providers/ses.js';
import { checkSnsUrl, SnsMessage, SnsSignatureError, verifySnsMessage } from '../../shared/providers/sns.js';
import type { App } from '../types.js';

const Result = z.object({
  received: z.number().int().describe('Events read from the payload'),
  applied: z.number().int().describe('Events that matched an email of this installation'),
  ignored: z.number().int().describe('Events for messages this installation does not know, about an address that is none of the email recipients (an email with copies), or holding text that cannot be stored'),
});
const Confirmed = z.object({ confirmed: z.boolean() });

const invalidSignature = (message: string) => new AppError(401, 'invalid_signature', message);
const notConfigured = (provider: string) => new NotFoundError(`The ${provider} webhook is not configured on this installation`);

/**
 * The mail providers' own webhooks at the root (docs/outcomes.md): each a thin
 * adapter from the provider's payload to the one delivery-feedback recorder
 * (`applyDeliveryFeedback`), after the provider's own proof of authenticity. A provider
 * whose secret is not configured is 404; a bad proof is 401 and changes nothing; an event
 * for an unknown message is 200 and ignored, so the provider stops retrying it.
 */
export async function providerWebhooksRoutes(app: App): Promise<void> {
  const { config, metrics, clock, snsCertificates } = app.services;
  const providers = config.providers;
  const raw = new WeakMap<FastifyRequest, Buffer>();
  // The exact bytes are kept (SendGrid signs them); SNS posts JSON as text/plain. A body that
  // is not JSON goes on as undefined and is answered 400 after the signature check.
  const keepRaw = (request: FastifyRequest, body: Buffer, done: (err: Error | null, body?: unknown) => void) => {
    raw.set(request, body);
    try {
      done(null, JSON.parse(body.toString('utf8')));
    } catch {
      done(null, undefined);
    }
  };
  app.removeContentTypeParser(['application/json', 'text/plain']);
  app.addContentTypeParser(['application/json', 'text/plain'], { parseAs: 'buffer' }, keepRaw);

  const malformed = () => new AppError(400, 'invalid_json', 'The body is not valid JSON');

  async function apply(events: DeliveryFeedback[]): Promise<z.infer<typeof Result>> {
    let applied = 0;
    for (const event of events) {
      if (!event.messageId && !event.providerMessageId) continue;
      if (await applyDeliveryFeedback(app.services.orm.em.fork(), event, { metrics, now: clock() })) applied++;
    }
    return { received: events.length, applied, ignored: events.length - applied };
  }

  const schema = { hide: true, response: { 200: z.union([Result, Confirmed]) } };

  app.post('/webhooks/ses', { schema }, async (request) => {
    if (!providers.ses.enabled) throw notConfigured('ses');
    if (request.body === undefined) throw malformed();
    const parsed = SnsMessage.safeParse(request.body);
    if (!parsed.success) throw invalidSignature('Not a signed Amazon SNS message');
    const message = parsed.data;
    try {
      await verifySnsMessage(message, { certificates: snsCertificates, hostPattern: providers.snsCertHostPattern, now: clock() });
    } catch (error) {
      if (error instanceof SnsSignatureError) throw invalidSignature(`Amazon SNS signature refused: ${error.message}`);
      throw error;
    }
    if (providers.ses.topicArns.length > 0 && !providers.ses.topicArns.includes(message.TopicArn)) {
      throw invalidSignature(`The topic ${message.TopicArn} is not one of SES_SNS_TOPIC_ARNS`);
    }
    if (message.Type === 'SubscriptionConfirmation') {
      // Confirmed by fetching SubscribeURL, itself an Amazon SNS address (never another host).
      let url: URL;
      try {
        url = checkSnsUrl(message.SubscribeURL ?? '', providers.snsCertHostPattern, 'SubscribeURL');
      } catch (error) {
        throw invalidSignature((error as Error).message);
      }
      const response = await fetch(url, { redirect: 'error', signal: AbortSignal.timeout(10_000) }).catch((error: unknown) => {
        throw new AppError(502, 'subscription_not_confirmed', `Amazon SNS did not answer the confirmation: ${(error as Error).message}`);
      });
      await response.body?.cancel();
      if (!response.ok) throw new AppError(502, 'subscription_not_confirmed', `Amazon SNS answered ${response.status} to the confirmation`);
      request.log.info({ topic: message.TopicArn }, 'confirmed the Amazon SNS subscription');
      return { confirmed: true };
    }
    if (message.Type === 'UnsubscribeConfirmation') return { confirmed: false };
    return apply(sesFeedback(message.Message));
  });

  app.post('/webhooks/postmark', { schema }, async (request) => {
    if (!providers.postmark) throw notConfigured('postmark');
    if (!postmarkAuthorized(request.headers.authorization, providers.postmark)) throw invalidSignature('Missing or wrong basic auth credentials');
    if (request.body === undefined) throw malformed();
    return apply(postmarkFeedback(request.body));
  });

  app.post('/webhooks/mailgun', { schema }, async (request) => {
    if (!providers.mailgunSigningKey) throw notConfigured('mailgun');
    if (request.body === undefined) throw malformed();
    const check = verifyMailgun(request.body, providers.mailgunSigningKey, clock());
    if (!check.ok) throw invalidSignature(`Mailgun signature refused: ${check.reason}`);
    return apply(mailgunFeedback(request.body));
  });

  const sendgridPublicKey = providers.sendgridPublicKey ? sendgridKey(providers.sendgridPublicKey) : undefined;
  app.post('/webhooks/sendgrid', { schema }, async (request) => {
    if (!sendgridPublicKey) throw notConfigured('sendgrid');
    const header = (name: string) => {
      const value = request.headers[name];
      return typeof value === 'string' ? value : undefined;
    };
    const check = verifySendgrid(
      raw.get(request) ?? Buffer.alloc(0),
      header('x-twilio-email-event-webhook-signature'),
      header('x-twilio-email-event-webhook-timestamp'),
      sendgridPublicKey,
      clock(),
    );
    if (!check.ok) throw invalidSignature(`SendGrid signature refused: ${check.reason}`);
    if (request.body === undefined) throw malformed();
    return apply(sendgridFeedback(request.body));
  });
}

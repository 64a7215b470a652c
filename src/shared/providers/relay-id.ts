/**
 * The relay's own id of a message, from its final `250` answer, when it gives one:
 * Amazon SES answers `250 Ok <SES message id>`, Postfix, SendGrid and Postmark
 * `250 2.0.0 Ok: queued as <id>`. Providers that replace the Message-ID identify the message
 * by this id in their webhooks, so it is recorded on the email at hand-over
 * (`emails.provider_message_id`). Answers without one (`250 OK: message queued`,
 * `250 Great success`) give undefined.
 */
const RELAY_ID = /^250[ -](?:[245]\.\d{1,3}\.\d{1,3}\s+)?(?:ok:?\s+)?(?:message\s+)?(?:queued as\s+)?<?([A-Za-z0-9][A-Za-z0-9._@+=-]{7,254})>?\s*$/i;

export function relayMessageId(response: string | undefined): string | undefined {
  if (!response) return undefined;
  return RELAY_ID.exec(response.trim())?.[1];
}

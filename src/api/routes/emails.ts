import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import type { Email } from '../../shared/db/entities/email.js';
import { assertSendingAllowed, assertSendingAllowedForAll } from '../../shared/domains/sending-policy.js';
import { SendEmailBody, newEmailFromBody } from '../../shared/emails/input.js';
import { LAST_EVENTS, lastEvent } from '../../shared/emails/last-event.js';
import { createEmails, getEmail, listEmails, requestHash, type EmailListRow, type Idempotency } from '../../shared/emails/service.js';
import { listAttachments, type AttachmentSummary } from '../../shared/submission/queries.js';
import { iso, limitQuery, list, listEnvelope, Timestamp } from '../schemas.js';
import type { App } from '../types.js';

/** `GET /emails`' query (the `list_emails` tool takes the same cursors). */
export const ListEmailsQuery = z.object({
  limit: limitQuery.default(20),
  after: z.string().min(1).optional(),
  before: z.string().min(1).optional(),
});

// docs/foundation.md "Errors": the batch takes up to 100 bodies, so up to 10 MiB.
const BATCH_BODY_LIMIT = 10 * 1024 * 1024;
const MAX_BATCH = 100;

const Tag = z.object({ name: z.string(), value: z.string() });
const EmailRow = z.object({
  id: z.string(),
  message_id: z.string().nullable(),
  from: z.string(),
  to: z.array(z.string()),
  subject: z.string(),
  cc: z.array(z.string()).nullable(),
  bcc: z.array(z.string()).nullable(),
  reply_to: z.array(z.string()).nullable(),
  scheduled_at: z.null(),
  created_at: Timestamp,
  last_event: z.enum(LAST_EVENTS),
}).meta({ id: 'Email' });
const EmailResource = EmailRow.extend({
  object: z.literal('email'),
  html: z.string().nullable(),
  text: z.string().nullable(),
  tags: z.array(Tag),
  // docs/smtp.md "From a message to an email": the attachments of a message submitted over SMTP;
  // empty for API email.
  attachments: z.array(z.object({ filename: z.string().nullable(), content_type: z.string(), size: z.number().int() })),
});

function row(email: EmailListRow) {
  return {
    id: email.id,
    message_id: email.messageId,
    from: email.from,
    to: [email.to],
    subject: email.subject,
    cc: email.cc,
    bcc: email.bcc,
    reply_to: email.replyTo,
    scheduled_at: null,
    created_at: iso(email.createdAt),
    last_event: lastEvent(email),
  };
}

function resource(email: Email, attachments: AttachmentSummary[]) {
  return {
    object: 'email' as const,
    ...row(email),
    // Until the worker stores the rendered body, client HTML is shown as sent; a markdown or
    // tiptap source is never returned as such (docs/emails.md). A submitted message without an
    // HTML part has none.
    html: email.contentKind === 'message' ? email.html || email.content || null : (email.html ?? (email.contentKind === 'html' ? email.content : null)),
    text: email.text,
    tags: email.tags ?? [],
    attachments,
  };
}

const IdempotencyHeaders = z.looseObject({
  'idempotency-key': z.string().min(1, 'must be 1 to 256 characters').max(256, 'must be 1 to 256 characters').optional(),
});

/** Only when the header is present: no hashing and no key row on the plain hot path. */
function idempotency(request: FastifyRequest, key: string | undefined, route: string): Idempotency | undefined {
  if (key === undefined) return undefined;
  return { key, requestHash: requestHash(route, request.body) };
}

export async function emailsRoutes(app: App): Promise<void> {
  const deps = { producer: app.services.producer, logger: app.services.logger };
  const writer = app.services.emailWriter;
  // A replayed Idempotency-Key accepts nothing new.
  const accepted = app.services.metrics.emailsAccepted.labels({ source: 'api' });

  app.post(
    '/emails',
    {
      config: { permission: 'emails' },
      schema: {
        tags: ['emails'],
        summary: 'Send an email',
        headers: IdempotencyHeaders,
        body: SendEmailBody,
        response: { 200: z.object({ id: z.string() }) },
      },
    },
    async (request) => {
      const email = newEmailFromBody(request.caller.organizationId, request.body);
      // docs/security.md "The sending policy"; a no-op (no query) unless
      // ALLOW_UNVERIFIED_DOMAINS=false.
      await assertSendingAllowed(request.em, app.services.config, email.organizationId, email.from);
      const { ids, replayed } = await writer.write(email, idempotency(request, request.headers['idempotency-key'], 'POST /emails'));
      if (!replayed) accepted.inc();
      return { id: ids[0]! };
    },
  );

  app.post(
    '/emails/batch',
    {
      bodyLimit: BATCH_BODY_LIMIT,
      config: { permission: 'emails' },
      schema: {
        tags: ['emails'],
        summary: 'Send up to 100 emails at once (all or nothing)',
        headers: IdempotencyHeaders,
        body: z.array(SendEmailBody).min(1, 'at least one email').max(MAX_BATCH, `at most ${MAX_BATCH} emails`),
        response: { 200: z.object({ data: z.array(z.object({ id: z.string() })) }) },
      },
    },
    async (request) => {
      const organizationId = request.caller.organizationId;
      await assertSendingAllowedForAll(
        request.em,
        app.services.config,
        organizationId,
        request.body.map((body, index) => ({ from: body.from, path: `${index}.from` })),
      );
      const { ids, replayed } = await createEmails(
        request.em,
        deps,
        request.body.map((body) => newEmailFromBody(organizationId, body)),
        { idempotency: idempotency(request, request.headers['idempotency-key'], 'POST /emails/batch') },
      );
      if (!replayed) accepted.inc(ids.length);
      return { data: ids.map((id) => ({ id })) };
    },
  );

  app.get(
    '/emails',
    {
      config: { permission: 'emails', permissionErrorName: 'validation_error' },
      schema: {
        tags: ['emails'],
        summary: 'List emails sent through the API, newest first',
        querystring: ListEmailsQuery,
        response: { 200: listEnvelope(EmailRow) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listEmails(request.em, request.caller.organizationId, request.query);
      return list(items.map(row), hasMore);
    },
  );

  app.get(
    '/emails/:id',
    {
      config: { permission: 'emails', permissionErrorName: 'validation_error' },
      schema: {
        tags: ['emails'],
        summary: 'Get an email',
        params: z.object({ id: z.string() }),
        response: { 200: EmailResource },
      },
    },
    async (request) => {
      const email = await getEmail(request.em, request.caller.organizationId, request.params.id);
      // Only a submitted message can have attachments: no query for the others.
      return resource(email, email.contentKind === 'message' ? await listAttachments(request.em, email.id) : []);
    },
  );
}

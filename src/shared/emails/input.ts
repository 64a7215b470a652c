import { z } from 'zod';
import type { ContentKind, EmailSource, EmailTag } from '../db/entities/email.js';
import { hasLineBreak, parseMailbox } from './addresses.js';
import { unstorableInJsonText } from '../storable.js';
import { JSON_TOO_DEEP, jsonNestedDeeperThan } from '../json-depth.js';
import { MARKDOWN_NESTING, markdownNestedTooDeep, MAX_CONTENT_CHARS, MAX_NESTING, nestedTooDeep, tiptapProblem } from './render.js';

/**
 * The send body of docs/emails.md "Validation", shared by `POST /emails`, the batch and any
 * other feature that takes a message from a client. Every header-bound value is refused
 * when it carries CR or LF, so nothing can inject a header.
 */

const MAX_SUBJECT = 998; // RFC 5322 line length
const MAX_LIST = 50;
// Rendering time grows with the content: each part is capped (docs/security.md).
const content = () => z.string().max(MAX_CONTENT_CHARS, `at most ${MAX_CONTENT_CHARS} characters`);

const mailbox = z
  .string()
  .max(1000)
  .superRefine((value, ctx) => {
    if (hasLineBreak(value)) ctx.addIssue({ code: 'custom', message: 'must not contain CR or LF' });
    else if (!parseMailbox(value)) ctx.addIssue({ code: 'custom', message: `"${value.slice(0, 100)}" is not an email address (expected addr or "Name <addr>")` });
  })
  .transform((value) => value.trim());

// A union member of its own, described: the OpenAPI generator drops a union member whose
// schema is still empty when it looks (a reused schema is filled in later), and the string
// form of an address list vanished from the document.
const oneMailbox = mailbox.describe('One address: addr or "Name <addr>"');

const mailboxList = z
  .union([oneMailbox, z.array(mailbox).max(MAX_LIST, `at most ${MAX_LIST} addresses`)])
  .transform((value) => (Array.isArray(value) ? value : [value]));

const tagPart = z.string().regex(/^[A-Za-z0-9_-]{1,256}$/, 'must be 1 to 256 ASCII letters, digits, _ or -');

const notAccepted = (field: string, hint: string) =>
  z.never({ error: `"${field}" is not accepted on v2: ${hint}` }).optional();

/** The body's "exactly one of html, markdown or tiptap" in JSON Schema (OpenAPI, the tool catalog). */
export const ONE_BODY_FIELD = { oneOf: [{ required: ['html'] }, { required: ['markdown'] }, { required: ['tiptap'] }] };

export const SendEmailBody = z
  .strictObject({
    from: mailbox.describe('Sender: addr or "Name <addr>"'),
    to: z
      .union([
        oneMailbox,
        z.array(mailbox).length(1, { error: (issue) => `must be a single address, got ${Array.isArray(issue.input) ? issue.input.length : 'none'} (send one email per recipient, or use cc/bcc)` }),
      ])
      .transform((value) => (Array.isArray(value) ? value[0]! : value))
      .describe('One recipient, as a string or a one-element array'),
    subject: z
      .string()
      .min(1, 'is required')
      .max(MAX_SUBJECT, `at most ${MAX_SUBJECT} characters`)
      .refine((v) => !hasLineBreak(v), 'must not contain CR or LF'),
    html: content().min(1).refine((html) => !nestedTooDeep(html), `is nested deeper than ${MAX_NESTING} elements`).optional(),
    markdown: content().min(1).refine((markdown) => !markdownNestedTooDeep(markdown), MARKDOWN_NESTING).optional(),
    tiptap: z
      .union([z.record(z.string(), z.unknown()), content()])
      .optional()
      .describe('A tiptap (ProseMirror) JSON document, as an object or its JSON text'),
    text: content().optional(),
    preview: z
      .string()
      .max(1000)
      .refine((v) => !hasLineBreak(v), 'must not contain CR or LF')
      .optional(),
    reply_to: mailboxList.optional(),
    cc: mailboxList.optional(),
    bcc: mailboxList.optional(),
    tags: z.array(z.strictObject({ name: tagPart, value: tagPart })).max(MAX_LIST, `at most ${MAX_LIST} tags`).optional(),
    content: notAccepted('content', 'send exactly one of html, markdown or tiptap'),
    contentType: notAccepted('contentType', 'send exactly one of html, markdown or tiptap'),
    attachments: notAccepted('attachments', 'attachments are not supported'),
    template: notAccepted('template', 'templates are not supported'),
    topic_id: notAccepted('topic_id', 'topics are not supported'),
    scheduled_at: notAccepted('scheduled_at', 'scheduled sending is not supported for transactional emails'),
    react: notAccepted('react', 'render to html first'),
    tracking: notAccepted('tracking', 'tracking follows the organization settings'),
  })
  .superRefine((body, ctx) => {
    const given = (['html', 'markdown', 'tiptap'] as const).filter((k) => body[k] !== undefined);
    if (given.length === 0) {
      ctx.addIssue({ code: 'custom', path: ['html'], message: 'give exactly one of html, markdown or tiptap' });
    } else if (given.length > 1) {
      ctx.addIssue({ code: 'custom', path: [given[1]!], message: `give exactly one of html, markdown or tiptap (got ${given.join(' and ')})` });
    }
    if (body.tiptap !== undefined) {
      let doc: unknown = body.tiptap;
      if (typeof doc === 'string') {
        // As deep as a body may be (JSON text is parsed and walked as a body is).
        if (jsonNestedDeeperThan(doc)) {
          ctx.addIssue({ code: 'custom', path: ['tiptap'], message: JSON_TOO_DEEP });
          return;
        }
        try {
          doc = JSON.parse(doc);
        } catch {
          ctx.addIssue({ code: 'custom', path: ['tiptap'], message: 'is not valid JSON' });
          return;
        }
        const unstorable = unstorableInJsonText(doc);
        if (unstorable) {
          ctx.addIssue({ code: 'custom', path: ['tiptap'], message: unstorable });
          return;
        }
      }
      const problem = tiptapProblem(doc);
      if (problem) ctx.addIssue({ code: 'custom', path: ['tiptap'], message: problem });
    }
  })
  .meta(ONE_BODY_FIELD);

export type SendEmailBody = z.output<typeof SendEmailBody>;

/** What the emails service inserts: one message to one recipient. */
export interface NewEmail {
  organizationId: string;
  source?: EmailSource;
  campaignId?: string | null;
  subscriberId?: string | null;
  from: string;
  to: string;
  subject: string;
  contentKind: ContentKind;
  /** HTML or markdown text, or a tiptap document as JSON text. */
  content: string;
  text?: string | null;
  preview?: string | null;
  replyTo?: string[] | null;
  cc?: string[] | null;
  bcc?: string[] | null;
  tags?: EmailTag[];
  /** Extra headers, e.g. List-Unsubscribe (no CR/LF in names or values). */
  headers?: Record<string, string>;
}

/** A validated API body to the service's input. */
export function newEmailFromBody(organizationId: string, body: SendEmailBody): NewEmail {
  const [contentKind, content]: [ContentKind, string] =
    body.html !== undefined
      ? ['html', body.html]
      : body.markdown !== undefined
        ? ['markdown', body.markdown]
        : ['tiptap', typeof body.tiptap === 'string' ? JSON.stringify(JSON.parse(body.tiptap)) : JSON.stringify(body.tiptap)];
  return {
    organizationId,
    source: 'api',
    from: body.from,
    to: body.to,
    subject: body.subject,
    contentKind,
    content,
    text: body.text ?? null,
    preview: body.preview ?? null,
    replyTo: body.reply_to ?? null,
    cc: body.cc ?? null,
    bcc: body.bcc ?? null,
    tags: body.tags ?? [],
  };
}

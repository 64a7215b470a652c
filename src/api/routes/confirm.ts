import { z } from 'zod';
import { confirmSubscription, findConfirmation, type ConfirmOutcome } from '../../shared/subscribers/confirmation.js';
import { escapeHtml } from '../../shared/html.js';
import type { App } from '../types.js';

function page(title: string, body: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex"><title>${escapeHtml(title)}</title>
<style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem;color:#222}h1{font-size:1.4rem}button{font-size:1rem;padding:.6rem 1.2rem;cursor:pointer}</style>
</head><body><h1>${escapeHtml(title)}</h1>${body}</body></html>`;
}

const paragraph = (text: string) => `<p>${escapeHtml(text)}</p>`;

const MESSAGES: Record<ConfirmOutcome, (org: string) => [string, string]> = {
  confirmed: (org) => ['Subscription confirmed', `Thank you: you will now receive emails from ${org}.`],
  already_confirmed: (org) => ['Already confirmed', `Your subscription to ${org} was already confirmed.`],
  not_pending: (org) => ['Nothing to confirm', `This address is not waiting for confirmation with ${org}.`],
};

const NOT_VALID = page('Link not valid', paragraph('This confirmation link is not valid.'));
const Params = z.object({ token: z.string().max(1000) });

/**
 * docs/audience.md "Double opt-in": `GET /confirm/{token}` (public, no API token) shows a page with
 * a confirm button and changes nothing, because mail scanners and link previews follow every link
 * of a message; the button's `POST /confirm/{token}` confirms double opt-in and stores the evidence
 * (time, IP, user agent of the POST). A forged token is 404.
 */
export async function confirmRoutes(app: App): Promise<void> {
  // The page's form posts a urlencoded body; the token alone says who. Scoped to this plugin.
  app.addContentTypeParser(['application/x-www-form-urlencoded', 'multipart/form-data', 'text/plain'], { parseAs: 'string', bodyLimit: 4096 }, (_req, body, done) =>
    done(null, body),
  );

  app.get(
    '/confirm/:token',
    // No automatic HEAD route: a link checker gets 404 and learns nothing.
    { exposeHeadRoute: false, schema: { hide: true, params: Params } },
    async (request, reply) => {
      void reply.type('text/html; charset=utf-8').header('cache-control', 'no-store');
      const found = await findConfirmation(request.em, app.services.signer, request.params.token);
      if (!found) return reply.code(404).send(NOT_VALID);
      const org = found.organizationName;
      if (found.status !== 'PENDING_CONFIRMATION') {
        const [title, message] = MESSAGES[found.status === 'SUBSCRIBED' ? 'already_confirmed' : 'not_pending'](org);
        return reply.send(page(title, paragraph(message)));
      }
      const action = escapeHtml(`/confirm/${request.params.token}`);
      return reply.send(
        page(
          `Confirm your subscription to ${org}`,
          `${paragraph(`Press the button to receive emails from ${org} at ${found.email}.`)}
<form method="post" action="${action}"><button type="submit">Confirm subscription</button></form>`,
        ),
      );
    },
  );

  app.post('/confirm/:token', { schema: { hide: true, params: Params } }, async (request, reply) => {
    void reply.type('text/html; charset=utf-8').header('cache-control', 'no-store');
    const result = await confirmSubscription(request.em, app.services.signer, request.params.token, {
      ip: request.ip ?? null,
      userAgent: request.headers['user-agent'] ?? null,
      now: app.services.clock(),
    });
    if (!result) return reply.code(404).send(NOT_VALID);
    const [title, message] = MESSAGES[result.outcome](result.organizationName);
    return reply.send(page(title, paragraph(message)));
  });
}

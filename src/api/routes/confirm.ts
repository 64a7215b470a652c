import { z } from 'zod';
import { confirmSubscription, type ConfirmOutcome } from '../../shared/subscribers/confirmation.js';
import type { App } from '../types.js';

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title: string, message: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex"><title>${escapeHtml(title)}</title>
<style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem;color:#222}h1{font-size:1.4rem}</style>
</head><body><h1>${escapeHtml(title)}</h1><p>${escapeHtml(message)}</p></body></html>`;
}

const MESSAGES: Record<ConfirmOutcome, (org: string) => [string, string]> = {
  confirmed: (org) => ['Subscription confirmed', `Thank you: you will now receive emails from ${org}.`],
  already_confirmed: (org) => ['Already confirmed', `Your subscription to ${org} was already confirmed.`],
  not_pending: (org) => ['Nothing to confirm', `This address is not waiting for confirmation with ${org}.`],
};

/** Contract 10: `GET /confirm/{token}` (public, no API token) confirms double opt-in. */
export async function confirmRoutes(app: App): Promise<void> {
  app.get(
    '/confirm/:token',
    // No automatic HEAD route: a link checker's HEAD request must not confirm anybody.
    { exposeHeadRoute: false, schema: { hide: true, params: z.object({ token: z.string().max(1000) }) } },
    async (request, reply) => {
      const result = await confirmSubscription(request.em, app.services.signer, request.params.token, {
        ip: request.ip ?? null,
        userAgent: request.headers['user-agent'] ?? null,
        now: app.services.clock(),
      });
      void reply.type('text/html; charset=utf-8').header('cache-control', 'no-store');
      if (!result) return reply.code(404).send(page('Link not valid', 'This confirmation link is not valid.'));
      const [title, message] = MESSAGES[result.outcome](result.organizationName);
      return reply.send(page(title, message));
    },
  );
}

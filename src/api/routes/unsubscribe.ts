import { z } from 'zod';
import { TEST_UNSUBSCRIBE_TOKEN } from '../../shared/campaigns/personalize.js';
import { resolveUnsubscribeToken, unsubscribeByToken } from '../../shared/campaigns/unsubscribe.js';
import { escapeHtml } from '../../shared/html.js';
import type { App } from '../types.js';

function page(title: string, body: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex"><title>${escapeHtml(title)}</title>
<style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem;color:#222}h1{font-size:1.4rem}button{font-size:1rem;padding:.6rem 1.2rem;cursor:pointer}</style>
</head><body><h1>${escapeHtml(title)}</h1>${body}</body></html>`;
}

const NOT_VALID = page('Link not valid', '<p>This unsubscribe link is not valid.</p>');
// A campaign's test send links here: a tester who follows it (or whose mail client posts the
// one-click request) learns what it is, and nothing changes.
const TEST_SEND = page('This was a test send', '<p>This link unsubscribes the recipient in the real campaign. A test send has no subscriber: nothing was changed.</p>');
const Params = z.object({ token: z.string().max(2000) });

/**
 * docs/campaigns.md "Personalisation and unsubscribe": `GET /u/{token}` shows a confirm page and
 * changes nothing; `POST /u/{token}` unsubscribes, from the page's form or as an RFC 8058 one-click
 * request (body `List-Unsubscribe=One-Click`, form-encoded). A forged token is 404.
 */
export async function unsubscribeRoutes(app: App): Promise<void> {
  // Form posts (the page's button, mail clients' one-click) carry a urlencoded body, and a
  // client may send anything else: it is read as text and not needed, the token alone says
  // who (any body, docs/campaigns.md; JSON that does not parse unsubscribes too). Scoped to this plugin.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'string', bodyLimit: 4096 }, (_req, body, done) => done(null, body));

  app.get('/u/:token', { exposeHeadRoute: false, schema: { hide: true, params: Params } }, async (request, reply) => {
    void reply.type('text/html; charset=utf-8').header('cache-control', 'no-store');
    if (request.params.token === TEST_UNSUBSCRIBE_TOKEN) return reply.send(TEST_SEND);
    const target = await resolveUnsubscribeToken(request.em, app.services.signer, request.params.token);
    if (!target) return reply.code(404).send(NOT_VALID);
    if (target === 'gone' || target.status !== 'SUBSCRIBED') {
      return reply.send(page('You are unsubscribed', '<p>This address does not receive these emails.</p>'));
    }
    const action = escapeHtml(`/u/${request.params.token}`);
    return reply.send(
      page(
        `Unsubscribe from ${target.organizationName}?`,
        `<p>${escapeHtml(target.email)} will no longer receive emails from ${escapeHtml(target.organizationName)}.</p>
<form method="post" action="${action}"><input type="hidden" name="List-Unsubscribe" value="One-Click"><button type="submit">Unsubscribe</button></form>`,
      ),
    );
  });

  app.post('/u/:token', { schema: { hide: true, params: Params } }, async (request, reply) => {
    void reply.type('text/html; charset=utf-8').header('cache-control', 'no-store');
    if (request.params.token === TEST_UNSUBSCRIBE_TOKEN) return reply.send(TEST_SEND);
    const target = await unsubscribeByToken({ em: request.em, producer: app.services.producer, clock: app.services.clock }, app.services.signer, request.params.token);
    if (!target) return reply.code(404).send(NOT_VALID);
    const org = target === 'gone' ? '' : ` from ${escapeHtml(target.organizationName)}`;
    return reply.send(page('You are unsubscribed', `<p>You will no longer receive these emails${org}.</p>`));
  });
}

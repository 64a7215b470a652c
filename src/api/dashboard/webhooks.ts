import type { FastifyRequest } from 'fastify';
import { ValidationError } from '../../shared/errors.js';
import { WEBHOOK_EVENT_TYPES } from '../../shared/webhooks/events.js';
import {
  createWebhook,
  deleteWebhook,
  getWebhook,
  listDeliveries,
  listWebhooks,
  retryDelivery,
  sendTestEvent,
  type WebhookDeps,
} from '../../shared/webhooks/service.js';
import { CreateWebhookBody } from '../routes/webhooks.js';
import type { App } from '../types.js';
import { formOf, noticeOf, optional, parseWith, sendPage, shownOf, signedIn, type DashboardContext } from './context.js';
import { csrfField, html, isoMinute, page, table, when, type PageUser, type SafeHtml } from './html.js';

/** The page shows this many endpoints and, per endpoint, this many recent deliveries. */
const ENDPOINTS_SHOWN = 100;
const DELIVERIES_SHOWN = 50;

/** Every value of a repeated form field (the event checkboxes); formOf keeps only the last. */
function allOf(request: FastifyRequest, name: string): string[] {
  const value = ((request.body ?? {}) as Record<string, unknown>)[name];
  const values = Array.isArray(value) ? value : value === undefined ? [] : [value];
  return values.filter((v): v is string => typeof v === 'string');
}

interface Entered {
  url?: string;
  events?: string[];
  description?: string;
}

function createForm(user: PageUser, entered: Entered = {}): SafeHtml {
  const chosen = new Set(entered.events ?? []);
  const box = (value: string, label: string) => {
    const id = `event-${value === '*' ? 'all' : value.replace('.', '-')}`;
    return html`<div class="field check"><input id="${id}" name="events" type="checkbox" value="${value}"${chosen.has(value) ? html` checked` : ''}><label for="${id}">${label}</label></div>`;
  };
  return html`<h2>Add an endpoint</h2>
<form method="post" action="/app/webhooks">
  ${csrfField(user)}
  <div class="field"><label for="webhook-url">URL</label><input id="webhook-url" name="url" type="url" required maxlength="2048" size="60" placeholder="https://example.com/webhooks/mailroom" value="${entered.url ?? ''}"></div>
  <fieldset class="events">
    <legend>Events</legend>
    ${box('*', 'All events (*)')}
    ${WEBHOOK_EVENT_TYPES.map((type) => box(type, type))}
  </fieldset>
  <div class="field"><label for="webhook-description">Description (optional)</label><input id="webhook-description" name="description" type="text" maxlength="500" value="${entered.description ?? ''}"></div>
  <button type="submit">Add endpoint</button>
</form>`;
}

export async function webhookPages(app: App, ctx: DashboardContext): Promise<void> {
  const { services } = ctx;
  // The same dependencies as the API's routes (src/api/routes/webhooks.ts).
  const deps = (request: { em: WebhookDeps['em'] }): WebhookDeps => ({
    em: request.em,
    box: services.box,
    dns: services.dns.fresh,
    allowPrivateUrls: services.config.webhookAllowPrivateUrls,
    maxEndpoints: services.config.maxWebhooksPerOrganization,
  });

  async function listPage(request: FastifyRequest, organizationId: string, user: PageUser, options: { before?: SafeHtml; entered?: Entered } = {}) {
    const { items } = await listWebhooks(request.em, organizationId, { limit: ENDPOINTS_SHOWN });
    const rows = items.map(
      (w) => html`<tr>
  <td class="value"><a href="/app/webhooks/${w.id}">${w.url}</a>${when(w.description, () => html`<br><small>${w.description}</small>`)}</td>
  <td>${w.events.join(', ')}</td>
  <td>${w.enabled ? html`<span class="badge enabled">enabled</span>` : html`<span class="badge failed">disabled</span> ${w.disabledReason ?? ''}`}</td>
  <td>${isoMinute(w.createdAt)}</td>
  <td><form method="post" action="/app/webhooks/${w.id}/test">${csrfField(user)}<button type="submit" class="secondary" aria-label="Send test event to ${w.url}">Send test event</button></form></td>
  <td><form method="post" action="/app/webhooks/${w.id}/delete">${csrfField(user)}<button type="submit" class="danger" aria-label="Delete the endpoint ${w.url}">Delete</button></form></td>
</tr>`,
    );
    return html`${options.before ?? ''}<h2>Endpoints</h2>${table('Webhook endpoints', ['URL', 'Events', 'State', 'Created', '', ''], rows)}${createForm(user, options.entered)}`;
  }

  /** The signing secret of an endpoint just added, from the form's redirect: shown this once. */
  const newSecret = (created: Record<string, string>) => html`<section aria-labelledby="new-secret-h">
<h2 id="new-secret-h">Signing secret of ${created.url ?? ''}</h2>
<p>Copy it now: it is shown only this once. Check the <code>webhook-signature</code> header of every delivery with it (docs/webhooks.md).</p>
<p class="secret" id="new-webhook-secret">${created.secret ?? ''}</p>
<button type="button" class="secondary" data-copy="${created.secret ?? ''}">Copy</button>
</section>`;

  app.get('/app/webhooks', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user, sessionId } = signedIn(request, 'settings');
    const shown = await ctx.sessions.takeShown(sessionId, shownOf(request));
    const body = await listPage(request, caller.organizationId, user, shown ? { before: newSecret(shown) } : {});
    return sendPage(reply, page({ title: 'Webhooks', active: 'webhooks', user, notice: noticeOf(request) }, body));
  });

  app.post('/app/webhooks', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user, sessionId } = signedIn(request, 'settings');
    const form = formOf(request);
    const entered: Entered = { url: form.url ?? '', events: allOf(request, 'events'), description: optional(form.description) };
    let created;
    try {
      // The API's body schema (URL scheme, known event types) and then the service's checks
      // (a private address when WEBHOOK_ALLOW_PRIVATE_URLS is off): the same messages.
      const input = parseWith(CreateWebhookBody, { url: entered.url, events: entered.events, description: entered.description });
      created = await createWebhook(deps(request), caller.organizationId, input);
    } catch (error) {
      if (!(error instanceof ValidationError)) throw error;
      // Nothing was created: the form again, as it was filled in, with the reason.
      const body = await listPage(request, caller.organizationId, user, { entered });
      return sendPage(reply, page({ title: 'Webhooks', active: 'webhooks', user, error: error.message }, body), 422);
    }
    // Post, redirect, get: a reload of the page shows the list, and adds no second endpoint.
    const shown = await ctx.sessions.keepToShow(sessionId, { url: created.url, secret: created.secret });
    return reply.redirect(`/app/webhooks?notice=webhook_created&shown=${shown}`, 303);
  });

  app.post('/app/webhooks/:id/delete', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'settings');
    await deleteWebhook(request.em, caller.organizationId, (request.params as { id: string }).id);
    return reply.redirect('/app/webhooks?notice=webhook_deleted', 303);
  });

  app.post('/app/webhooks/:id/test', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'settings');
    const id = (request.params as { id: string }).id;
    await sendTestEvent(request.em, caller.organizationId, id, services.clock());
    return reply.redirect(`/app/webhooks/${encodeURIComponent(id)}?notice=webhook_test`, 303);
  });

  app.get('/app/webhooks/:id', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'settings');
    const w = await getWebhook(request.em, caller.organizationId, (request.params as { id: string }).id);
    const { items } = await listDeliveries(request.em, caller.organizationId, w.id, { limit: DELIVERIES_SHOWN });
    const rows = items.map(
      (d) => html`<tr>
  <td>${d.type}</td>
  <td><span class="badge ${d.status}">${d.status}</span></td>
  <td>${d.attempts}</td>
  <td>${d.lastStatusCode ?? ''}${when(d.lastError, () => html` <small>${d.lastError}</small>`)}</td>
  <td>${isoMinute(d.nextAttemptAt)}</td>
  <td>${isoMinute(d.createdAt)}</td>
  <td><form method="post" action="/app/webhooks/${w.id}/deliveries/${d.id}/retry">${csrfField(user)}<button type="submit" class="secondary" aria-label="Retry the delivery ${d.id}">Retry</button></form></td>
</tr>`,
    );
    const body = html`<dl class="facts">
  <dt>URL</dt><dd class="value">${w.url}</dd>
  ${when(w.description, () => html`<dt>Description</dt><dd>${w.description}</dd>`)}
  <dt>Events</dt><dd>${w.events.join(', ')}</dd>
  <dt>State</dt><dd>${w.enabled ? 'enabled' : `disabled${w.disabledReason ? `: ${w.disabledReason}` : ''}`}</dd>
  <dt>Id</dt><dd>${w.id}</dd>
</dl>
<form method="post" action="/app/webhooks/${w.id}/test" class="inline">${csrfField(user)}<button type="submit">Send test event</button></form>
<h2>Recent deliveries</h2>
${table('Recent deliveries', ['Type', 'Status', 'Attempts', 'Last answer', 'Next attempt', 'Created', ''], rows)}
<p><a href="/app/webhooks">All endpoints</a></p>`;
    return sendPage(reply, page({ title: 'Webhook endpoint', active: 'webhooks', user, notice: noticeOf(request) }, body));
  });

  app.post('/app/webhooks/:id/deliveries/:msgId/retry', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'settings');
    const { id, msgId } = request.params as { id: string; msgId: string };
    await retryDelivery(request.em, caller.organizationId, id, msgId);
    return reply.redirect(`/app/webhooks/${encodeURIComponent(id)}?notice=webhook_retry`, 303);
  });
}

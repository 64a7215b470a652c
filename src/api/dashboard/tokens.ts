import { z } from 'zod';
import { PRESETS, PresetSchema } from '../../shared/tokens/permissions.js';
import { revokeToken } from '../../shared/tokens/revoke.js';
import { createToken, listTokens } from '../../shared/tokens/service.js';
import type { App } from '../types.js';
import { formOf, noticeOf, parseWith, sendPage, shownOf, signedIn, type DashboardContext } from './context.js';
import { csrfField, html, isoMinute, page, table, type PageUser } from './html.js';

const CreateForm = z.object({
  name: z.string().trim().min(1, 'must be 1 to 100 characters').max(100, 'must be 1 to 100 characters'),
  preset: PresetSchema,
});

function createForm(user: PageUser) {
  return html`<h2>Create a token</h2>
<form method="post" action="/app/tokens" class="inline">
  ${csrfField(user)}
  <div class="field"><label for="token-name">Name</label><input id="token-name" name="name" type="text" required maxlength="100"></div>
  <div class="field"><label for="preset">Permissions</label><select id="preset" name="preset">
    ${Object.entries(PRESETS).map(([name, scopes]) => html`<option value="${name}"${name === 'full' ? html` selected` : ''}>${name}: ${scopes.join(', ')}</option>`)}
  </select></div>
  <div class="field"><button type="submit">Create token</button></div>
</form>`;
}

export async function tokenPages(app: App, ctx: DashboardContext): Promise<void> {
  const { services } = ctx;
  // API processes cache token lists and secrets: the same announcement as the API's routes
  // (drops this process's list entry, publishes on the token-change channel, logs a failure).
  const announce = (organizationId: string) => services.tokenListCache.changed(organizationId);

  async function listPage(organizationId: string, em: Parameters<typeof listTokens>[0], user: PageUser, extra = html``) {
    const { items } = await listTokens(em, organizationId, undefined);
    const rows = items.map(
      (t) => html`<tr>
  <td>${t.name}</td><td>…${t.last4}</td><td>${t.permissions.join(', ')}</td><td>${isoMinute(t.createdAt)}</td>
  <td><form method="post" action="/app/tokens/${t.id}/revoke">${csrfField(user)}<button type="submit" class="danger" aria-label="Revoke the token ${t.name}">Revoke</button></form></td>
</tr>`,
    );
    return html`${extra}${createForm(user)}<h2>Tokens</h2>${table('API tokens', ['Name', 'Ends with', 'Permissions', 'Created', ''], rows)}`;
  }

  /** The secret of a token just created, from the form's redirect: shown this once. */
  const newToken = (token: Record<string, string>) => html`<section aria-labelledby="new-token-h">
<h2 id="new-token-h">Your new token "${token.name ?? ''}"</h2>
<p>Copy it now: it is shown only this once.</p>
<p class="secret" id="new-token">${token.token ?? ''}</p>
<button type="button" class="secondary" data-copy="${token.token ?? ''}">Copy</button>
</section>`;

  app.get('/app/tokens', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user, sessionId } = signedIn(request, 'tokens');
    const shown = await ctx.sessions.takeShown(sessionId, shownOf(request));
    const body = await listPage(caller.organizationId, request.em, user, shown ? newToken(shown) : undefined);
    return sendPage(reply, page({ title: 'API tokens', active: 'tokens', user, notice: noticeOf(request) }, body));
  });

  app.post('/app/tokens', { schema: { hide: true } }, async (request, reply) => {
    const { caller, sessionId } = signedIn(request, 'tokens');
    const input = parseWith(CreateForm, formOf(request));
    // A new token every time: the dashboard never shows an existing secret again.
    const token = await createToken(request.em, services.box, caller, { name: input.name, preset: input.preset, reuseIfExists: false }, services.config.maxTokensPerOrganization);
    await announce(caller.organizationId);
    // Post, redirect, get: a reload of the page shows the list, and creates no second token.
    const shown = await ctx.sessions.keepToShow(sessionId, { name: token.name, token: token.token });
    return reply.redirect(`/app/tokens?notice=token_created&shown=${shown}`, 303);
  });

  app.post('/app/tokens/:id/revoke', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'tokens');
    await revokeToken(request.em, caller.organizationId, (request.params as { id: string }).id);
    // This process refuses the secret at once (only this organization's cached secrets are
    // dropped, not every tenant's); the others as soon as the announcement reaches them (the
    // same channel as DELETE /api/v2/tokens/{id}).
    ctx.tokenCache.forgetOrganization(caller.organizationId);
    await announce(caller.organizationId);
    return reply.redirect('/app/tokens?notice=revoked', 303);
  });
}

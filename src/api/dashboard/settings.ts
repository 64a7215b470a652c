import { getOrganization, updateOrganization } from '../../shared/organizations/service.js';
import type { App } from '../types.js';
import { formOf, noticeOf, sendPage, signedIn, type DashboardContext } from './context.js';
import { csrfField, html, page } from './html.js';

const SWITCHES = [
  { key: 'doubleOptIn', label: 'Double opt-in: new subscribers confirm their address by email' },
  { key: 'trackOpens', label: 'Track opens' },
  { key: 'trackClicks', label: 'Track clicks' },
] as const;

export async function settingsPages(app: App, _ctx: DashboardContext): Promise<void> {
  app.get('/app/settings', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'settings');
    const org = await getOrganization(request.em, caller.organizationId);
    const body = html`<dl class="facts"><dt>Organization</dt><dd>${org.name}</dd><dt>Id</dt><dd>${org.id}</dd></dl>
<form method="post" action="/app/settings">
  ${csrfField(user)}
  ${SWITCHES.map(
    (s) => html`<div class="field check"><input id="${s.key}" name="${s.key}" type="checkbox" value="on"${org[s.key] ? html` checked` : ''}><label for="${s.key}">${s.label}</label></div>`,
  )}
  <button type="submit">Save settings</button>
</form>`;
    return sendPage(reply, page({ title: 'Settings', active: 'settings', user, notice: noticeOf(request) }, body));
  });

  app.post('/app/settings', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'settings');
    const form = formOf(request);
    await updateOrganization(request.em, caller.organizationId, {
      doubleOptIn: form.doubleOptIn === 'on',
      trackOpens: form.trackOpens === 'on',
      trackClicks: form.trackClicks === 'on',
    });
    return reply.redirect('/app/settings?notice=saved', 303);
  });
}

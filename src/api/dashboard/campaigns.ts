import { z } from 'zod';
import {
  campaignDeps,
  createCampaign,
  DEFAULT_TIMEZONE,
  getCampaign,
  listCampaigns,
  patchCampaign,
  scheduleCampaign,
  sendTestEmail,
  type CampaignView,
} from '../../shared/campaigns/service.js';
import { listSenders } from '../../shared/domains/senders.js';
import type { RenderPool } from '../../shared/emails/render-pool.js';
import { ValidationError } from '../../shared/errors.js';
import { CreateBody, PatchBody, SendBody } from '../routes/campaigns.js';
import type { App } from '../types.js';
import { formOf, noticeOf, optional, parseWith, query, sendPage, signedIn, type DashboardContext } from './context.js';
import { csrfField, html, isoMinute, page, table, when, type PageUser } from './html.js';

const PAGE_SIZE = 25;
// IANA's zones as the runtime knows them, and UTC (which the API takes too, but the list omits).
const TIME_ZONES = ['UTC', ...Intl.supportedValuesOf('timeZone').filter((zone) => zone !== 'UTC')];
const STARTER = 'Hello {{name}},\n\nWrite your message in **Markdown**.\n\n[Unsubscribe]({{unsubscribe_url}})\n';

const lf = (text: string) => text.replace(/\r\n?/g, '\n');

/** The form's fields as the API's body: blank optional fields are left out. */
function campaignBody(form: Record<string, string>) {
  return {
    name: form.name ?? '',
    subject: form.subject ?? '',
    preview: optional(form.preview) ?? null,
    // A textarea submits CRLF line ends (HTML's form encoding); the API's Markdown has LF.
    content: lf(form.content ?? ''),
    contentType: 'MARKDOWN' as const,
    senderId: optional(form.senderId) ?? null,
    replyTo: optional(form.replyTo) ?? null,
  };
}

/** What the editor's fields hold: the campaign's, or what was entered in a form the API refused. */
type Entered = Record<'name' | 'subject' | 'preview' | 'content' | 'senderId' | 'replyTo', string>;

function enteredOf(c: CampaignView['campaign'] | undefined): Entered {
  return {
    name: c?.name ?? '',
    subject: c?.subject ?? '',
    preview: c?.preview ?? '',
    content: c ? (typeof c.content === 'string' ? c.content : JSON.stringify(c.content, null, 2)) : STARTER,
    senderId: c?.senderId ?? '',
    replyTo: c?.replyTo ?? '',
  };
}

/** The form's fields as they were entered. */
function enteredFrom(form: Record<string, string>): Entered {
  const { name = '', subject = '', preview = '', content = '', senderId = '', replyTo = '' } = form;
  return { name, subject, preview, content, senderId, replyTo };
}

async function editor(
  render: RenderPool,
  organizationId: string,
  em: Parameters<typeof listSenders>[0],
  user: PageUser,
  view: CampaignView | null,
  entered: Entered = enteredOf(view?.campaign),
): Promise<ReturnType<typeof html>> {
  const { items: senders } = await listSenders(em, organizationId, 100);
  const c = view?.campaign;
  const markdown = !c || c.contentType === 'MARKDOWN';
  // Content written in another editor is never taken from the form (the POST ignores it).
  const content = markdown ? entered.content : enteredOf(c).content;
  const action = c ? `/app/campaigns/${c.id}` : '/app/campaigns';
  return html`
<div class="split">
<form method="post" action="${action}" id="campaign-form">
  ${csrfField(user)}
  <div class="field"><label for="name">Name</label><input id="name" name="name" type="text" required maxlength="100" value="${entered.name}"></div>
  <div class="field"><label for="subject">Subject</label><input id="subject" name="subject" type="text" maxlength="998" value="${entered.subject}"></div>
  <div class="field"><label for="preview">Preview text</label><input id="preview" name="preview" type="text" maxlength="1000" value="${entered.preview}"></div>
  <div class="field"><label for="senderId">Sender</label><select id="senderId" name="senderId">
    <option value="">none yet</option>
    ${senders.map((s) => html`<option value="${s.id}"${s.id === entered.senderId ? html` selected` : ''}>${s.name} &lt;${s.email}&gt;</option>`)}
  </select>${when(senders.length === 0, () => html`<span class="muted">Add a sender on a <a href="/app/domains">domain</a> first.</span>`)}</div>
  <div class="field"><label for="replyTo">Reply-To</label><input id="replyTo" name="replyTo" type="email" value="${entered.replyTo}"></div>
  ${
    markdown
      ? html`<div class="field"><label for="content">Content (Markdown)</label>
  <textarea id="content" name="content" hx-post="/app/campaigns/preview" hx-trigger="input changed delay:400ms, load" hx-target="#live-preview" hx-include="#campaign-form">${content}</textarea></div>`
      : html`<p class="muted">This campaign's content was written in a ${c!.contentType} editor: change it through the API.</p><input type="hidden" name="content" value="${content}">`
  }
  <button type="submit">${c ? 'Save' : 'Create draft'}</button>
</form>
<section aria-labelledby="live-h">
  <h2 id="live-h">Live preview</h2>
  <div id="live-preview" aria-live="polite">${markdown ? '' : await preview(render, c!.contentType, c!.content, c!.subject, c!.preview)}</div>
</section>
</div>`;
}

/** Rendered in a render thread: the editor asks for it as its author types, up to 1 MiB of content. */
async function preview(render: RenderPool, contentType: CampaignView['campaign']['contentType'], content: unknown, subject: string, previewText: string | null) {
  const rendered = await render.campaign({ contentType, content, subject, preview: previewText });
  return html`<iframe class="preview" sandbox="" title="Preview of the campaign email" srcdoc="${rendered.html}"></iframe>`;
}

export async function campaignPages(app: App, ctx: DashboardContext): Promise<void> {
  const { services } = ctx;
  const deps = () => campaignDeps(services);

  app.get('/app/campaigns', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'campaigns');
    const { after } = parseWith(z.object({ after: z.string().max(100).optional() }), request.query);
    const { items, hasMore } = await listCampaigns(request.em, caller.organizationId, { limit: PAGE_SIZE, after: after || undefined });
    const rows = items.map(
      ({ campaign: c, recipientCount }) => html`<tr>
  <td><a href="/app/campaigns/${c.id}">${c.name}</a></td>
  <td><span class="badge ${c.status}">${c.status}</span></td>
  <td>${c.scheduledAt ? isoMinute(c.scheduledAt) : ''}</td>
  <td>${recipientCount}</td><td>${c.emailsSentCount}</td><td>${c.emailsOpenedCount}</td><td>${c.emailsClickedCount}</td>
</tr>`,
    );
    const body = html`<p><a class="button" href="/app/campaigns/new">New campaign</a></p>
${table('Campaigns', ['Name', 'Status', 'Scheduled', 'Recipients', 'Sent', 'Opened', 'Clicked'], rows)}
<nav class="pager" aria-label="Pages">
  ${when(after, () => html`<a href="/app/campaigns">Newest</a>`)}
  ${when(hasMore, () => html`<a href="/app/campaigns${query({ after: items[items.length - 1]!.campaign.id })}">Older</a>`)}
</nav>`;
    return sendPage(reply, page({ title: 'Campaigns', active: 'campaigns', user, notice: noticeOf(request) }, body));
  });

  app.get('/app/campaigns/new', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'campaigns');
    return sendPage(reply, page({ title: 'New campaign', active: 'campaigns', user }, await editor(services.render, caller.organizationId, request.em, user, null)));
  });

  app.post('/app/campaigns/preview', { schema: { hide: true } }, async (request, reply) => {
    signedIn(request, 'campaigns');
    const form = formOf(request);
    return sendPage(reply, await preview(services.render, 'MARKDOWN', form.content ?? '', form.subject ?? '', optional(form.preview) ?? null));
  });

  app.post('/app/campaigns', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'campaigns');
    const form = formOf(request);
    let created;
    try {
      created = await createCampaign(request.em, caller.organizationId, parseWith(CreateBody, campaignBody(form)), services.clock());
    } catch (error) {
      if (!(error instanceof ValidationError)) throw error;
      // Nothing was created: the editor again, as it was filled in, with the reason.
      const body = await editor(services.render, caller.organizationId, request.em, user, null, enteredFrom(form));
      return sendPage(reply, page({ title: 'New campaign', active: 'campaigns', user, error: error.message }, body), error.statusCode);
    }
    return reply.redirect(`/app/campaigns/${created.campaign.id}?notice=created`, 303);
  });

  /** A campaign's page: its facts, and for a draft the editor (holding `entered`, when given) and the test and schedule forms. */
  async function campaignPage(em: Parameters<typeof listSenders>[0], organizationId: string, user: PageUser, view: CampaignView, entered?: Entered) {
    const c = view.campaign;
    const facts = html`<dl class="facts">
  <dt>Status</dt><dd><span class="badge ${c.status}">${c.status}</span></dd>
  <dt>Recipients</dt><dd>${view.recipientCount}</dd>
  ${when(c.scheduledAt, () => html`<dt>Scheduled</dt><dd>${isoMinute(c.scheduledAt)} (${c.timezone ?? ''})</dd>`)}
  <dt>Sent / opened / clicked</dt><dd>${c.emailsSentCount} / ${c.emailsOpenedCount} / ${c.emailsClickedCount}</dd>
  <dt>Sender</dt><dd>${view.sender ? `${view.sender.name} <${view.sender.email}>` : 'none'}</dd>
</dl>`;
    if (c.status !== 'DRAFT') return html`${facts}<h2>Message</h2><p>${c.subject}</p>${await preview(services.render, c.contentType, c.content, c.subject, c.preview)}`;
    return html`${facts}
${await editor(services.render, organizationId, em, user, view, entered)}
<h2>Send a test</h2>
<form method="post" action="/app/campaigns/${c.id}/test" class="inline">
  ${csrfField(user)}
  <div class="field"><label for="test-to">Test address</label><input id="test-to" name="to" type="email" required value="${user.email}"></div>
  <div class="field"><button type="submit" class="secondary">Send test</button></div>
</form>
<h2>Schedule</h2>
<form method="post" action="/app/campaigns/${c.id}/schedule" class="inline">
  ${csrfField(user)}
  <div class="field"><label for="scheduledAt">Send at (leave empty for now)</label><input id="scheduledAt" name="scheduledAt" type="datetime-local"></div>
  <div class="field"><label for="timezone">Time zone</label><select id="timezone" name="timezone" data-browser-zone>
    ${TIME_ZONES.map((zone) => html`<option value="${zone}"${zone === DEFAULT_TIMEZONE ? html` selected` : ''}>${zone}</option>`)}
  </select></div>
  <div class="field"><button type="submit">Schedule</button></div>
</form>`;
  }

  app.get('/app/campaigns/:id', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'campaigns');
    const view = await getCampaign(request.em, caller.organizationId, (request.params as { id: string }).id);
    const body = await campaignPage(request.em, caller.organizationId, user, view);
    return sendPage(reply, page({ title: view.campaign.name, active: 'campaigns', user, notice: noticeOf(request) }, body));
  });

  app.post('/app/campaigns/:id', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'campaigns');
    const { id } = request.params as { id: string };
    const form = formOf(request);
    const existing = await getCampaign(request.em, caller.organizationId, id);
    const stored = existing.campaign.content;
    // Content the form sent back unchanged (line ends aside) is not a change of it.
    const values = { ...campaignBody(form), ...(typeof stored === 'string' && lf(stored) === lf(form.content ?? '') ? { content: undefined } : {}) };
    try {
      // Content written in another editor is kept as it is: the form shows it read-only.
      const input = parseWith(PatchBody, existing.campaign.contentType === 'MARKDOWN' ? values : { ...values, content: undefined, contentType: undefined });
      const fields = Object.fromEntries(Object.entries(input).filter(([, v]) => v !== undefined));
      await patchCampaign(request.em, caller.organizationId, id, fields, []);
    } catch (error) {
      if (!(error instanceof ValidationError)) throw error;
      // Nothing was saved: the page again, its editor as it was filled in, with the reason.
      const body = await campaignPage(request.em, caller.organizationId, user, existing, enteredFrom(form));
      return sendPage(reply, page({ title: existing.campaign.name, active: 'campaigns', user, error: error.message }, body), error.statusCode);
    }
    return reply.redirect(`/app/campaigns/${id}?notice=saved`, 303);
  });

  app.post('/app/campaigns/:id/test', { schema: { hide: true } }, async (request, reply) => {
    // A test send mails any address: a send, as on the API (docs/security.md).
    const { caller } = signedIn(request, 'send');
    const { id } = request.params as { id: string };
    const { to } = parseWith(z.object({ to: z.email('must be an email address') }), { to: formOf(request).to?.trim() });
    await sendTestEmail(request.em, deps(), caller.organizationId, id, to, services.clock());
    return reply.redirect(`/app/campaigns/${id}?notice=test_sent`, 303);
  });

  app.post('/app/campaigns/:id/schedule', { schema: { hide: true } }, async (request, reply) => {
    // Scheduling is a send: the API asks for the `send` permission.
    const { caller } = signedIn(request, 'send');
    const { id } = request.params as { id: string };
    const form = formOf(request);
    const input = parseWith(SendBody, { scheduledAt: optional(form.scheduledAt), timezone: optional(form.timezone) }, 400);
    await scheduleCampaign(request.em, deps(), caller.organizationId, id, input, services.clock());
    return reply.redirect(`/app/campaigns/${id}?notice=scheduled`, 303);
  });
}

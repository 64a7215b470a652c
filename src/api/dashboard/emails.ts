import { z } from 'zod';
import { LAST_EVENTS, lastEvent } from '../../shared/emails/last-event.js';
import { getEmail, listEmails } from '../../shared/emails/service.js';
import { emailTimeline } from '../../shared/emails/timeline.js';
import type { App } from '../types.js';
import { parseWith, query, sendPage, signedIn, type DashboardContext } from './context.js';
import { html, isoMinute, page, table, when } from './html.js';

const PAGE_SIZE = 50;

const EmailsQuery = z.object({
  to: z.string().trim().max(320).optional(),
  event: z.union([z.enum(LAST_EVENTS), z.literal('')]).optional(),
  after: z.string().max(100).optional(),
});

export async function emailPages(app: App, _ctx: DashboardContext): Promise<void> {
  app.get('/app/emails', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'emails');
    const q = parseWith(EmailsQuery, request.query);
    const to = q.to || undefined;
    const event = q.event || undefined;
    const { items, hasMore } = await listEmails(request.em, caller.organizationId, {
      limit: PAGE_SIZE,
      after: q.after || undefined,
      to,
      lastEvent: event,
    });
    const rows = items.map(
      (e) => html`<tr>
  <td>${isoMinute(e.createdAt)}</td>
  <td><a href="/app/emails/${e.id}">${e.to}</a></td>
  <td>${e.subject}</td>
  <td><span class="badge ${lastEvent(e)}">${lastEvent(e)}</span></td>
</tr>`,
    );
    const body = html`
<form method="get" action="/app/emails" class="filters" role="search">
  <div class="field"><label for="to">Recipient</label><input id="to" name="to" type="search" value="${to ?? ''}" placeholder="jane@example.com"></div>
  <div class="field"><label for="event">Last event</label><select id="event" name="event">
    <option value="">any</option>
    ${LAST_EVENTS.map((name) => html`<option value="${name}"${name === event ? html` selected` : ''}>${name}</option>`)}
  </select></div>
  <div class="field"><button type="submit">Search</button></div>
</form>
${table('Emails', ['Created', 'To', 'Subject', 'Last event'], rows)}
<nav class="pager" aria-label="Pages">
  ${when(q.after, () => html`<a href="/app/emails${query({ to, event })}">Newest</a>`)}
  ${when(hasMore, () => html`<a href="/app/emails${query({ to, event, after: items[items.length - 1]!.id })}">Older</a>`)}
</nav>`;
    return sendPage(reply, page({ title: 'Emails', active: 'emails', user }, body));
  });

  app.get('/app/emails/:id', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'emails');
    const { id } = request.params as { id: string };
    const email = await getEmail(request.em, caller.organizationId, id);
    const timeline = await emailTimeline(request.em, email);
    const shown = email.html ?? (email.contentKind === 'html' ? email.content : null);
    const body = html`
<dl class="facts">
  <dt>From</dt><dd>${email.from}</dd>
  <dt>To</dt><dd>${email.to}</dd>
  ${when(email.cc?.length, () => html`<dt>Cc</dt><dd>${email.cc!.join(', ')}</dd>`)}
  <dt>Subject</dt><dd>${email.subject}</dd>
  <dt>Last event</dt><dd><span class="badge ${lastEvent(email)}">${lastEvent(email)}</span></dd>
  <dt>Message-ID</dt><dd>${email.messageId ?? 'not sent yet'}</dd>
  ${when(email.failureReason, () => html`<dt>Failure</dt><dd>${email.failureReason}</dd>`)}
  <dt>Id</dt><dd>${email.id}</dd>
</dl>
<div class="split">
  <section aria-labelledby="preview-h">
    <h2 id="preview-h">Preview</h2>
    ${
      shown
        ? html`<iframe class="preview" sandbox="" title="The email as its recipient sees it" srcdoc="${shown}"></iframe>`
        : html`<p class="muted">The HTML is rendered when the email is sent.</p>`
    }
  </section>
  <section aria-labelledby="timeline-h">
    <h2 id="timeline-h">Timeline</h2>
    <ol class="timeline">
      ${timeline.map((t) => html`<li><span class="badge ${t.type}">${t.type}</span> ${isoMinute(t.at)}${when(t.detail, () => html` <span class="muted">${t.detail}</span>`)}</li>`)}
    </ol>
  </section>
</div>`;
    return sendPage(reply, page({ title: email.subject || '(no subject)', active: 'emails', user }, body));
  });
}

import { z } from 'zod';
import { SUBSCRIBER_STATUSES } from '../../shared/db/entities/index.js';
import { AppError, ValidationError } from '../../shared/errors.js';
import { addSubscriberTags, getSubscriber, listSubscribers, removeSubscriberTags } from '../../shared/subscribers/service.js';
import { listTags } from '../../shared/subscribers/tags.js';
import { sameToken } from './session.js';
import type { App } from '../types.js';
import { formOf, noticeOf, parseWith, query, sendPage, signedIn, type DashboardContext } from './context.js';
import { csrfField, html, isoMinute, page, table, when } from './html.js';
import { IMPORT_MAX_BYTES, parseCsvUpload, type ImportProgress } from './imports.js';

const PAGE_SIZE = 50;

const AudienceQuery = z.object({
  q: z.string().trim().max(320).optional(),
  status: z.union([z.enum(SUBSCRIBER_STATUSES), z.literal('')]).optional(),
  tag: z.string().trim().max(100).optional(),
  after: z.string().max(100).optional(),
});

const TagForm = z.object({ tag: z.string().trim().min(1, 'enter a tag name').max(100, 'at most 100 characters') });

function progressFragment(id: string, p: ImportProgress) {
  const running = p.state === 'running';
  return html`<div id="import-progress"${running ? html` hx-get="/app/audience/import/${id}/progress" hx-trigger="every 500ms" hx-swap="outerHTML"` : ''}>
  <label for="import-bar">${running ? 'Importing…' : p.state === 'done' ? 'Import finished' : 'Import stopped'}</label>
  <progress id="import-bar" max="${Math.max(p.total, 1)}" value="${p.done}">${p.done} of ${p.total}</progress>
  <p role="status">${p.done} of ${p.total} rows: ${p.created} created, ${p.updated} updated, ${p.skipped} skipped, ${p.merged} merged into an earlier row of their address.</p>
  ${when(p.error, () => html`<p class="error" role="alert">${p.error}</p>`)}
  ${when(p.problems.length, () => html`<details><summary>Skipped rows and warnings</summary><ul>${p.problems.map((x) => html`<li>${x}</li>`)}</ul></details>`)}
  ${when(!running, () => html`<p><a href="/app/audience">See the audience</a></p>`)}
</div>`;
}

export async function audiencePages(app: App, ctx: DashboardContext): Promise<void> {
  const { services } = ctx;
  const audience = (em: typeof services.orm.em) => ({ em, producer: services.producer, clock: services.clock });

  app.get('/app/audience', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'subscribers');
    const q = parseWith(AudienceQuery, request.query);
    const filters = { query: q.q || undefined, status: q.status || undefined, tag: q.tag || undefined };
    const [{ items, hasMore }, tags] = await Promise.all([
      listSubscribers(request.em, caller.organizationId, { limit: PAGE_SIZE, after: q.after || undefined, ...filters }),
      listTags(request.em.fork(), caller.organizationId),
    ]);
    const rows = items.map(
      (s) => html`<tr>
  <td><a href="/app/audience/${s.id}">${s.email}</a></td>
  <td>${s.name ?? ''}</td>
  <td><span class="badge ${s.status}">${s.status}</span></td>
  <td>${s.tags.map((t) => t.name).join(', ')}</td>
  <td>${isoMinute(s.createdAt)}</td>
</tr>`,
    );
    const shown = { q: q.q, status: q.status, tag: q.tag };
    const body = html`<p><a class="button" href="/app/audience/import">Import a CSV file</a></p>
<form method="get" action="/app/audience" class="filters" role="search">
  <div class="field"><label for="q">Email or name</label><input id="q" name="q" type="search" value="${q.q ?? ''}"></div>
  <div class="field"><label for="status">Status</label><select id="status" name="status"><option value="">any</option>
    ${SUBSCRIBER_STATUSES.map((s) => html`<option value="${s}"${s === q.status ? html` selected` : ''}>${s}</option>`)}</select></div>
  <div class="field"><label for="tag">Tag</label><select id="tag" name="tag"><option value="">any</option>
    ${tags.map((t) => html`<option value="${t.name}"${t.name === q.tag ? html` selected` : ''}>${t.name}</option>`)}</select></div>
  <div class="field"><button type="submit">Search</button></div>
</form>
${table('Subscribers', ['Email', 'Name', 'Status', 'Tags', 'Created'], rows)}
<nav class="pager" aria-label="Pages">
  ${when(q.after, () => html`<a href="/app/audience${query(shown)}">Newest</a>`)}
  ${when(hasMore, () => html`<a href="/app/audience${query({ ...shown, after: items[items.length - 1]!.id })}">Older</a>`)}
</nav>`;
    return sendPage(reply, page({ title: 'Audience', active: 'audience', user }, body));
  });

  app.get('/app/audience/import', { schema: { hide: true } }, async (request, reply) => {
    const { user } = signedIn(request, 'subscribers');
    const body = html`<p>The first line names the columns: <code>email</code> (required), <code>name</code>, <code>phone</code>,
<code>tags</code> (separated by <code>;</code> or <code>|</code>); any other column becomes a custom field. Up to ${IMPORT_MAX_BYTES / 1024 / 1024} MiB; larger files go through the command line.</p>
<form method="post" action="/app/audience/import" enctype="multipart/form-data">
  ${csrfField(user)}
  <div class="field"><label for="file">CSV file</label><input id="file" name="file" type="file" accept=".csv,text/csv" required></div>
  <div class="field check"><input id="resubscribe" name="resubscribe" type="checkbox" value="on"><label for="resubscribe">Resubscribe addresses that had unsubscribed</label></div>
  <button type="submit">Import</button>
</form>`;
    return sendPage(reply, page({ title: 'Import subscribers', active: 'audience', user }, body));
  });

  app.post('/app/audience/import', { schema: { hide: true }, config: { csrfInHandler: true } }, async (request, reply) => {
    const { caller, session } = signedIn(request, 'subscribers');
    if (!request.isMultipart()) throw new ValidationError('file: send the form with a CSV file', [{ path: 'file', message: 'missing' }]);
    const fields: Record<string, string> = {};
    let content: Buffer | undefined;
    for await (const part of request.parts()) {
      if (part.type === 'file') {
        // The token comes before the file in the form: nothing of a forged upload is read.
        if (!sameToken(fields._csrf, session.csrf)) break;
        content = await part.toBuffer();
      } else if (typeof part.value === 'string') {
        fields[part.fieldname] = part.value;
      }
    }
    if (!sameToken(fields._csrf, session.csrf)) {
      throw new AppError(403, 'csrf_token_mismatch', 'This form is out of date (its security token does not match your session); nothing was changed. Reload the page and try again.');
    }
    if (!content) throw new ValidationError('file: choose a CSV file', [{ path: 'file', message: 'missing' }]);
    const parsed = parseCsvUpload(content);
    const id = await ctx.imports.start(caller.organizationId, parsed, { resubscribe: fields.resubscribe === 'on' });
    return reply.redirect(`/app/audience/import/${id}`, 303);
  });

  app.get('/app/audience/import/:id', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'subscribers');
    const { id } = request.params as { id: string };
    const progress = await ctx.imports.get(caller.organizationId, id);
    if (!progress) return sendPage(reply, page({ title: 'Import not found', active: 'audience', user, error: 'No such import (imports are kept for a day).' }, html``), 404);
    return sendPage(reply, page({ title: 'Import subscribers', active: 'audience', user }, progressFragment(id, progress)));
  });

  app.get('/app/audience/import/:id/progress', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'subscribers');
    const { id } = request.params as { id: string };
    const progress = await ctx.imports.get(caller.organizationId, id);
    if (!progress) return sendPage(reply, html`<p class="error" role="alert">No such import.</p>`);
    return sendPage(reply, progressFragment(id, progress));
  });

  app.get('/app/audience/:id', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'subscribers');
    const s = await getSubscriber(request.em, caller.organizationId, (request.params as { id: string }).id);
    const fields = Object.entries(s.fields);
    const body = html`<dl class="facts">
  <dt>Email</dt><dd>${s.email}</dd>
  <dt>Name</dt><dd>${s.name ?? ''}</dd>
  <dt>Phone</dt><dd>${s.phone ?? ''}</dd>
  <dt>Status</dt><dd><span class="badge ${s.status}">${s.status}</span></dd>
  <dt>Revenue</dt><dd>${(s.revenue / 100).toFixed(2)}</dd>
  <dt>Created</dt><dd>${isoMinute(s.createdAt)}</dd>
  ${fields.map(([k, v]) => html`<dt>${k}</dt><dd>${v}</dd>`)}
</dl>
<h2>Tags</h2>
<ul class="tags">
  ${s.tags.map(
    (t) => html`<li>${t.name} <form method="post" action="/app/audience/${s.id}/tags/remove" class="inline-form">${csrfField(user)}<input type="hidden" name="tag" value="${t.name}"><button type="submit" class="link" aria-label="Remove tag ${t.name}">remove</button></form></li>`,
  )}
</ul>
<form method="post" action="/app/audience/${s.id}/tags" class="inline">
  ${csrfField(user)}
  <div class="field"><label for="tag">Add a tag</label><input id="tag" name="tag" type="text" required maxlength="100"></div>
  <div class="field"><button type="submit">Add</button></div>
</form>`;
    return sendPage(reply, page({ title: s.email, active: 'audience', user, notice: noticeOf(request) }, body));
  });

  app.post('/app/audience/:id/tags', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'subscribers');
    const { id } = request.params as { id: string };
    const { tag } = parseWith(TagForm, formOf(request));
    await addSubscriberTags(audience(request.em), caller.organizationId, id, { tags: [tag] });
    return reply.redirect(`/app/audience/${id}?notice=tag_added`, 303);
  });

  app.post('/app/audience/:id/tags/remove', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'subscribers');
    const { id } = request.params as { id: string };
    const { tag } = parseWith(TagForm, formOf(request));
    await removeSubscriberTags(audience(request.em), caller.organizationId, id, { tags: [tag] });
    return reply.redirect(`/app/audience/${id}?notice=tag_removed`, 303);
  });
}

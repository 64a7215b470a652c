import type { FastifyRequest } from 'fastify';
import { announceDomainChange } from '../../shared/domains/dkim.js';
import { createSender, listSenders } from '../../shared/domains/senders.js';
import { createDomain, findDomain, listDomains, mailHostOf, NOT_STARTED_MESSAGE, verifyDomain } from '../../shared/domains/service.js';
import { ValidationError } from '../../shared/errors.js';
import { CreateDomainBody, CreateSenderBody } from '../routes/domains.js';
import type { App } from '../types.js';
import { formOf, noticeOf, optional, parseWith, sendPage, signedIn, type DashboardContext } from './context.js';
import { csrfField, html, isoMinute, page, table, when } from './html.js';

const PURPOSE: Record<string, string> = { dkim: 'DKIM', spf: 'SPF', dmarc: 'DMARC', return_path: 'Return path' };

export async function domainPages(app: App, ctx: DashboardContext): Promise<void> {
  const { services } = ctx;
  const mailHost = mailHostOf(services.config.publicUrl);

  /** The domains page; after a refused form, that form again as it was filled in, with the reason. */
  async function listPage(request: FastifyRequest, refused?: { domain: string; error: string }) {
    const { caller, user } = signedIn(request, 'domains');
    const { items } = await listDomains(request.em, caller.organizationId, 100);
    const rows = items.map(
      ({ domain: d, emailSendersCount }) => html`<tr>
  <td><a href="/app/domains/${d.id}">${d.domain}</a></td>
  <td><span class="badge ${d.status}">${d.status}</span></td>
  <td>${emailSendersCount}</td>
  <td>${isoMinute(d.createdAt)}</td>
</tr>`,
    );
    const body = html`<form method="post" action="/app/domains" class="inline">
  ${csrfField(user)}
  <div class="field"><label for="domain">Add a sending domain</label><input id="domain" name="domain" type="text" required maxlength="253" placeholder="mail.example.com" value="${refused?.domain ?? ''}"${refused ? html` aria-invalid="true"` : ''}></div>
  <div class="field"><button type="submit">Add domain</button></div>
</form>
${table('Domains', ['Domain', 'Status', 'Senders', 'Added'], rows)}`;
    return page({ title: 'Domains', active: 'domains', user, notice: noticeOf(request), ...(refused ? { error: refused.error } : {}) }, body);
  }

  app.get('/app/domains', { schema: { hide: true } }, async (request, reply) => sendPage(reply, await listPage(request)));

  app.post('/app/domains', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'domains');
    const domainName = optional(formOf(request).domain) ?? '';
    let domain;
    try {
      const input = parseWith(CreateDomainBody, { domain: domainName });
      domain = await createDomain(request.em, services.box, caller.organizationId, mailHost, input, services.clock(), services.config.maxDomainsPerOrganization);
    } catch (error) {
      if (!(error instanceof ValidationError)) throw error;
      // Nothing was created: the form again, with the reason.
      return sendPage(reply, await listPage(request, { domain: domainName, error: error.message }), 422);
    }
    await announceDomainChange(services, caller.organizationId);
    return reply.redirect(`/app/domains/${domain.id}?notice=created`, 303);
  });

  /** A domain's page; after a refused sender form, that form again as it was filled in, with the reason. */
  async function domainPage(request: FastifyRequest, refused?: { name: string; email: string; error: string }) {
    const { caller, user } = signedIn(request, 'domains');
    const d = await findDomain(request.em, caller.organizationId, (request.params as { id: string }).id);
    const { items: senders } = await listSenders(request.em, caller.organizationId, 100);
    const mine = senders.filter((s) => s.domainId === d.id);
    const rows = d.dnsRecords.map(
      (r) => html`<tr>
  <td>${PURPOSE[r.purpose] ?? r.purpose}</td>
  <td>${r.type}</td>
  <td class="value">${r.name} <button type="button" class="secondary" data-copy="${r.name}" aria-label="Copy the name of the ${PURPOSE[r.purpose] ?? r.purpose} record">Copy</button></td>
  <td class="value">${r.priority !== null ? `${r.priority} ` : ''}${r.value} <button type="button" class="secondary" data-copy="${r.value}" aria-label="Copy the value of the ${PURPOSE[r.purpose] ?? r.purpose} record">Copy</button></td>
  <td><span class="badge ${r.status}">${r.status}</span></td>
</tr>`,
    );
    const body = html`<dl class="facts">
  <dt>Status</dt><dd><span class="badge ${d.status}">${d.status}</span></dd>
  ${when(d.status !== 'VERIFIED' && d.message, () => html`<dt>What is missing</dt><dd>${d.message === NOT_STARTED_MESSAGE ? 'Publish the DNS records below, then choose "Verify now".' : d.message}</dd>`)}
  <dt>Region</dt><dd>${d.region}</dd>
</dl>
<h2>DNS records to publish</h2>
${table('DNS records', ['Purpose', 'Type', 'Name', 'Value', 'Status'], rows)}
<form method="post" action="/app/domains/${d.id}/verify" class="inline">${csrfField(user)}<button type="submit">Verify now</button></form>
<h2>Senders</h2>
<ul>${mine.map((s) => html`<li>${s.name} &lt;${s.email}&gt;</li>`)}</ul>
<form method="post" action="/app/domains/${d.id}/senders" class="inline">
  ${csrfField(user)}
  <div class="field"><label for="sender-name">Name</label><input id="sender-name" name="name" type="text" required maxlength="100" value="${refused?.name ?? ''}"></div>
  <div class="field"><label for="sender-email">Address</label><input id="sender-email" name="email" type="email" required placeholder="news@${d.domain}" value="${refused?.email ?? ''}"${refused ? html` aria-invalid="true"` : ''}></div>
  <div class="field"><button type="submit">Add sender</button></div>
</form>`;
    return page({ title: d.domain, active: 'domains', user, notice: noticeOf(request), ...(refused ? { error: refused.error } : {}) }, body);
  }

  app.get('/app/domains/:id', { schema: { hide: true } }, async (request, reply) => sendPage(reply, await domainPage(request)));

  app.post('/app/domains/:id/verify', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'domains');
    const domain = await verifyDomain(request.em, services.producer, caller.organizationId, (request.params as { id: string }).id, services.clock());
    return reply.redirect(`/app/domains/${domain.id}?notice=verifying`, 303);
  });

  app.post('/app/domains/:id/senders', { schema: { hide: true } }, async (request, reply) => {
    const { caller } = signedIn(request, 'domains');
    const { id } = request.params as { id: string };
    const domain = await findDomain(request.em, caller.organizationId, id);
    const form = formOf(request);
    const entered = { name: form.name ?? '', email: form.email ?? '' };
    try {
      const input = parseWith(CreateSenderBody, entered);
      // The form is this domain's: a sender of another domain would be added there, out of sight.
      await createSender(request.em, caller.organizationId, input, services.clock(), domain);
    } catch (error) {
      if (!(error instanceof ValidationError)) throw error;
      return sendPage(reply, await domainPage(request, { ...entered, error: error.message }), 422);
    }
    return reply.redirect(`/app/domains/${domain.id}?notice=sender_added`, 303);
  });
}

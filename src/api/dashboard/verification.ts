import { readVerificationQuota } from '../../shared/verification/quota.js';
import { verificationDeps, verifyEmail, type VerificationResult } from '../../shared/verification/index.js';
import { VerifyBody } from '../routes/verification.js';
import type { App } from '../types.js';
import { formOf, parseWith, sendPage, signedIn, type DashboardContext } from './context.js';
import { csrfField, html, isoMinute, page, when, type PageUser } from './html.js';

function quotaMeter(quota: { limit: number; used: number; resetsAt: Date }) {
  return html`<h2>Quota this month</h2>
<label for="quota">${quota.used} of ${quota.limit} checks used (resets ${isoMinute(quota.resetsAt)})</label>
<meter id="quota" min="0" max="${Math.max(quota.limit, 1)}" low="${Math.floor(quota.limit * 0.7)}" high="${Math.floor(quota.limit * 0.9)}" optimum="0" value="${quota.used}">${quota.used} of ${quota.limit}</meter>
<p class="muted">The API, the command-line tool and this page share one monthly quota.</p>`;
}

function form(user: PageUser, email = '') {
  return html`<form method="post" action="/app/verification" class="inline">
  ${csrfField(user)}
  <div class="field"><label for="email">Email address</label><input id="email" name="email" type="text" required maxlength="1024" value="${email}"></div>
  <div class="field"><button type="submit">Check</button></div>
</form>`;
}

function resultView(r: VerificationResult) {
  return html`<h2>Result</h2>
<dl class="facts" id="verification-result">
  <dt>Address</dt><dd>${r.email}</dd>
  <dt>Result</dt><dd><span class="badge">${r.result}</span> ${r.accept ? 'accept' : 'reject'}</dd>
  <dt>Score</dt><dd>${r.score ?? 'none'}</dd>
  ${when(r.suggestion, () => html`<dt>Did you mean</dt><dd>${r.suggestion}</dd>`)}
  <dt>Domain</dt><dd>${r.traits.domain_category}</dd>
</dl>
${when(r.issues.length, () => html`<ul>${r.issues.map((i) => html`<li><strong>${i.severity}</strong> ${i.code}: ${i.message}</li>`)}</ul>`)}`;
}

export async function verificationPages(app: App, ctx: DashboardContext): Promise<void> {
  const { services } = ctx;

  app.get('/app/verification', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'emails');
    const quota = await readVerificationQuota(request.em, caller.organizationId, services.clock());
    return sendPage(reply, page({ title: 'Verification', active: 'verification', user }, html`${form(user)}${quotaMeter(quota)}`));
  });

  app.post('/app/verification', { schema: { hide: true } }, async (request, reply) => {
    const { caller, user } = signedIn(request, 'emails');
    const { email } = parseWith(VerifyBody, { email: formOf(request).email ?? '' });
    const result = await verifyEmail(verificationDeps(services), { organizationId: caller.organizationId, email });
    const quota = { limit: result.quota.limit, used: result.quota.used, resetsAt: new Date(result.quota.resets_at) };
    return sendPage(reply, page({ title: 'Verification', active: 'verification', user }, html`${form(user, email)}${resultView(result)}${quotaMeter(quota)}`));
  });
}

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import formbody from '@fastify/formbody';
import multipart from '@fastify/multipart';
import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import type { Services } from '../../shared/container.js';
import { errorHeaders, toErrorBody } from '../plugins/errors.js';
import { AppError, NotFoundError } from '../../shared/errors.js';
import { unstorableError, unstorablePath } from '../../shared/storable.js';
import { checkPassword, PASSWORD_MAX } from '../../shared/users/service.js';
import type { TokenCache } from '../../shared/tokens/token-cache.js';
import type { App } from '../types.js';
import { audiencePages } from './audience.js';
import { APP_CSS, APP_JS } from './assets.js';
import { campaignPages } from './campaigns.js';
import { formOf, noticeOf, sendPage, signedIn, type DashboardContext } from './context.js';
import { domainPages } from './domains.js';
import { emailPages } from './emails.js';
import { html, page } from './html.js';
import { IMPORT_MAX_BYTES, ImportTracker } from './imports.js';
import { sameToken, SESSION_COOKIE, SESSION_IDLE_SECONDS, SessionStore } from './session.js';
import { settingsPages } from './settings.js';
import { tokenPages } from './tokens.js';
import { verificationPages } from './verification.js';
import { webhookPages } from './webhooks.js';

const require = createRequire(import.meta.url);
// htmx from node_modules, served by mailroom (no CDN, no build step).
const HTMX = readFileSync(require.resolve('htmx.org/dist/htmx.min.js'));

// Scripts only from mailroom itself: an email's HTML shown in the sandboxed frame inherits
// this policy too, on top of the sandbox. Images may come from anywhere an email links to.
const CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data: https: http:",
  "frame-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

const PUBLIC_PATHS = new Set(['/', '/app/login', '/app/assets/app.css', '/app/assets/app.js', '/app/assets/htmx.min.js']);

function cookieOf(request: FastifyRequest, name: string): string | undefined {
  const header = request.headers.cookie;
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const index = part.indexOf('=');
    if (index > 0 && part.slice(0, index).trim() === name) return part.slice(index + 1).trim();
  }
  return undefined;
}

function sessionCookie(services: Services, value: string, maxAge: number): string {
  const secure = services.config.publicUrl.startsWith('https:') ? '; Secure' : '';
  return `${SESSION_COOKIE}=${value}; Path=/app; HttpOnly; SameSite=Lax; Max-Age=${maxAge}${secure}`;
}

/**
 * A change must come from a page of mailroom itself: a browser names the page's origin on
 * every POST, and a form posted from another site is refused before anything is read.
 */
function fromAnotherSite(services: Services, request: FastifyRequest): boolean {
  const source = request.headers.origin ?? request.headers.referer;
  if (!source || source === 'null') return source === 'null';
  let host: string;
  try {
    host = new URL(source).host;
  } catch {
    return true;
  }
  return host !== request.headers.host && host !== new URL(services.config.publicUrl).host;
}

const LoginForm = z.object({
  email: z.string().trim().min(1, 'enter your email address').max(254),
  password: z.string().min(1, 'enter your password').max(PASSWORD_MAX),
});

function loginPage(options: { error?: string; notice?: string; email?: string }): ReturnType<typeof page> {
  return page(
    { title: 'Sign in', error: options.error, notice: options.notice },
    html`<form method="post" action="/app/login" class="narrow">
  <div class="field"><label for="email">Email</label><input id="email" name="email" type="email" autocomplete="username" required value="${options.email ?? ''}"></div>
  <div class="field"><label for="password">Password</label><input id="password" name="password" type="password" autocomplete="current-password" required></div>
  <button type="submit">Sign in</button>
</form>`,
  );
}

/** The dashboard (docs/dashboard.md), at /app, in the API process. */
export async function dashboard(app: App, options: { tokenCache: TokenCache }): Promise<void> {
  const services = app.services;
  const ctx: DashboardContext = {
    services,
    sessions: new SessionStore(services),
    tokenCache: options.tokenCache,
    imports: new ImportTracker(services),
  };
  app.addHook('onClose', async () => ctx.imports.close());

  await app.register(formbody, { bodyLimit: 1024 * 1024 });
  await app.register(multipart, { limits: { fileSize: IMPORT_MAX_BYTES, files: 1, fields: 10 } });
  app.decorateRequest('dashboard', null);

  app.addHook('onRequest', async (request, reply) => {
    void reply.header('content-security-policy', CSP);
    void reply.header('x-frame-options', 'DENY');
    void reply.header('referrer-policy', 'same-origin');
    void reply.header('x-content-type-options', 'nosniff');
    if (request.method === 'POST' && fromAnotherSite(services, request)) {
      return sendPage(
        reply,
        page({ title: 'Request refused', error: 'This form was sent from another site, so nothing was changed. Open mailroom and try again there.' }, html``),
        403,
      );
    }
    const path = request.url.split('?')[0]!;
    if (PUBLIC_PATHS.has(path)) return;
    const id = cookieOf(request, SESSION_COOKIE);
    const session = id ? await ctx.sessions.get(id) : null;
    if (!id || !session) {
      // A cookie without a live session: it expired (12 hours idle) or was signed out.
      const signIn = id ? '/app/login?notice=expired' : '/app/login';
      // An htmx request would follow a redirect inside its XHR and put the sign-in page in
      // the panel it updates: htmx sends the whole window there instead (HX-Redirect).
      if (request.headers['hx-request']) return reply.header('hx-redirect', signIn).header('cache-control', 'no-store').code(200).send('');
      return reply.redirect(signIn, 303);
    }
    // The session lasts 12 hours without a request (its Redis key is renewed by the read
    // above): the cookie's own lifetime is renewed with it on every page a person loads, or
    // the browser would drop it 12 hours after sign-in however busy they were. (Not on a
    // POST: sign-out clears the cookie there.)
    if (request.method === 'GET') void reply.header('set-cookie', sessionCookie(services, id, SESSION_IDLE_SECONDS));
    request.dashboard = {
      sessionId: id,
      session,
      caller: { organizationId: session.organizationId, tokenId: session.userId, permissions: ['*'] },
      user: { email: session.email, csrf: session.csrf },
    };
  });

  // Every change of a signed-in page carries the session's token (a form field, or the
  // header htmx sends). A multipart body is not read before the handler: the route that takes
  // an upload says so (`config.csrfInHandler`) and checks the form's token itself, before it
  // reads the file; any other route sent a multipart body finds no form field here, so it
  // needs the header.
  app.addHook('preHandler', async (request, reply) => {
    if (request.method !== 'POST' || !request.dashboard) return;
    const multipart = request.isMultipart();
    if (multipart && (request.routeOptions.config as { csrfInHandler?: boolean }).csrfInHandler) return;
    const given = request.headers['x-csrf-token'] ?? (multipart ? undefined : formOf(request)._csrf);
    if (!sameToken(given, request.dashboard.session.csrf)) {
      return sendPage(reply, page({ title: 'Request refused', user: request.dashboard.user, error: 'This form is out of date (its security token does not match your session); nothing was changed. Reload the page and try again.' }, html``), 403);
    }
  });

  // Text PostgreSQL cannot store, in a query or a form, is refused as the API refuses it (422
  // naming the field) before any page reads or counts anything (after the CSRF check: a form
  // from another site is refused as such). A CSV upload's content is checked by the import.
  app.addHook('preHandler', async (request) => {
    const where = unstorablePath(request.query, 'query') ?? (request.isMultipart() || request.body === undefined ? undefined : unstorablePath(request.body, 'form'));
    if (where) throw unstorableError(where);
  });

  app.setErrorHandler((error: Error & { statusCode?: number }, request, reply) => {
    // The API's status and headers for the same error (PostgreSQL or Redis unreachable: 503 with
    // Retry-After, docs/operations.md), with words for a person.
    const body = toErrorBody(error, request);
    const status = body.statusCode;
    const down = status === 503 && !(error instanceof AppError);
    if (down) request.log.warn({ err: error }, 'dashboard request failed: a dependency is unavailable');
    else if (status >= 500) request.log.error({ err: error }, 'dashboard request failed');
    errorHeaders(error, body, reply);
    const message = down
      ? 'mailroom cannot reach its database or queue right now; nothing was changed. Try again in a moment.'
      : status >= 500
        ? 'Something went wrong on our side; nothing was changed. Try again in a moment.'
        : body.message;
    if (request.headers['hx-request']) return sendPage(reply, html`<p class="error" role="alert">${message}</p>`, 200);
    const user = request.dashboard?.user;
    return sendPage(reply, page({ title: status === 404 ? 'Not found' : 'That did not work', user, error: message }, html`<p><a href="/app">Back to the dashboard</a></p>`), status);
  });

  app.get('/', { schema: { hide: true } }, async (_request, reply) => reply.redirect('/app', 302));
  app.get('/app', { schema: { hide: true } }, async (_request, reply) => reply.redirect('/app/emails', 302));
  app.get('/app/assets/htmx.min.js', { schema: { hide: true } }, async (_request, reply) =>
    reply.header('content-type', 'text/javascript; charset=utf-8').header('cache-control', 'public, max-age=3600').send(HTMX),
  );
  app.get('/app/assets/app.js', { schema: { hide: true } }, async (_request, reply) =>
    reply.header('content-type', 'text/javascript; charset=utf-8').header('cache-control', 'public, max-age=3600').send(APP_JS),
  );
  app.get('/app/assets/app.css', { schema: { hide: true } }, async (_request, reply) =>
    reply.header('content-type', 'text/css; charset=utf-8').header('cache-control', 'public, max-age=3600').send(APP_CSS),
  );

  app.get('/app/login', { schema: { hide: true } }, async (request, reply) => sendPage(reply, loginPage({ notice: noticeOf(request) })));

  app.post('/app/login', { schema: { hide: true } }, async (request, reply) => {
    const parsed = LoginForm.safeParse(formOf(request));
    if (!parsed.success) return sendPage(reply, loginPage({ error: parsed.error.issues.map((i) => i.message).join('; ') }), 422);
    const { email, password } = parsed.data;
    const wait = await ctx.sessions.attempt(email);
    if (wait > 0) {
      void reply.header('retry-after', String(wait));
      return sendPage(reply, loginPage({ email, error: `Too many failed sign-ins for this address: try again in ${wait} seconds.` }), 429);
    }
    const user = await checkPassword(request.em, email, password);
    if (!user) return sendPage(reply, loginPage({ email, error: 'Wrong email or password.' }), 401);
    await ctx.sessions.succeeded(email);
    const { id } = await ctx.sessions.create({ userId: user.id, organizationId: user.organizationId, email: user.email });
    void reply.header('set-cookie', sessionCookie(services, id, SESSION_IDLE_SECONDS));
    return reply.redirect('/app/emails', 303);
  });

  app.post('/app/logout', { schema: { hide: true } }, async (request, reply) => {
    if (request.dashboard) await ctx.sessions.destroy(request.dashboard.sessionId);
    void reply.header('set-cookie', sessionCookie(services, '', 0));
    return reply.redirect('/app/login?notice=signed_out', 303);
  });

  for (const pages of [emailPages, campaignPages, audiencePages, domainPages, verificationPages, tokenPages, webhookPages, settingsPages]) {
    await pages(app, ctx);
  }

  // A page that does not exist (a stale bookmark, a mistyped link): the dashboard's own "Not
  // found" page, with its navigation, rather than the API's JSON (any route above wins over it).
  app.get('/app/*', { schema: { hide: true } }, async (request) => {
    signedIn(request);
    throw new NotFoundError('There is no such page in the dashboard.');
  });
}


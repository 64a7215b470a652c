import { escapeHtml } from '../../shared/html.js';

/** Markup that is already escaped: interpolated as it is. */
export class SafeHtml {
  constructor(readonly value: string) {}
  toString(): string {
    return this.value;
  }
}

type Value = SafeHtml | string | number | boolean | null | undefined | readonly Value[];

function render(value: Value): string {
  if (value === null || value === undefined || value === false || value === true) return '';
  if (value instanceof SafeHtml) return value.value;
  if (Array.isArray(value)) return value.map(render).join('');
  return escapeHtml(String(value));
}

/** Every interpolated string is HTML-escaped; nested `html` results are not escaped twice. */
export function html(strings: TemplateStringsArray, ...values: Value[]): SafeHtml {
  let out = strings[0]!;
  values.forEach((value, i) => {
    out += render(value) + strings[i + 1]!;
  });
  return new SafeHtml(out);
}

export function when(condition: unknown, value: () => SafeHtml): SafeHtml | '' {
  return condition ? value() : '';
}

export function isoMinute(date: Date | null | undefined): string {
  return date ? `${date.toISOString().slice(0, 16).replace('T', ' ')} UTC` : '';
}

export interface NavItem {
  href: string;
  label: string;
  key: string;
}

export const NAV: NavItem[] = [
  { key: 'emails', href: '/app/emails', label: 'Emails' },
  { key: 'campaigns', href: '/app/campaigns', label: 'Campaigns' },
  { key: 'audience', href: '/app/audience', label: 'Audience' },
  { key: 'domains', href: '/app/domains', label: 'Domains' },
  { key: 'verification', href: '/app/verification', label: 'Verification' },
  { key: 'tokens', href: '/app/tokens', label: 'API tokens' },
  { key: 'webhooks', href: '/app/webhooks', label: 'Webhooks' },
  { key: 'settings', href: '/app/settings', label: 'Settings' },
];

export interface PageUser {
  email: string;
  csrf: string;
}

export interface PageOptions {
  title: string;
  active?: string;
  user?: PageUser;
  notice?: string;
  error?: string;
}

/** The whole document: htmx and the stylesheet from mailroom itself, no CDN. */
export function page(options: PageOptions, body: SafeHtml): SafeHtml {
  const { user } = options;
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="htmx-config" content='{"includeIndicatorStyles":false,"allowEval":false}'>
<title>${options.title} · mailroom</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/app/assets/app.css">
<script src="/app/assets/htmx.min.js" defer></script>
<script src="/app/assets/app.js" defer></script>
</head>
<body${user ? html` hx-headers='${JSON.stringify({ 'x-csrf-token': user.csrf })}'` : ''}>
<a class="skip" href="#main">Skip to content</a>
<header class="top">
  <a class="brand" href="/app">mailroom</a>
  ${when(user, () => html`<nav aria-label="Main">
    <ul>${NAV.map((item) => html`<li><a href="${item.href}"${item.key === options.active ? html` aria-current="page"` : ''}>${item.label}</a></li>`)}</ul>
  </nav>
  <form method="post" action="/app/logout" class="signout">
    <input type="hidden" name="_csrf" value="${user!.csrf}">
    <span class="who">${user!.email}</span>
    <button type="submit" class="link">Sign out</button>
  </form>`)}
</header>
<main id="main">
<h1>${options.title}</h1>
${when(options.notice, () => html`<p class="notice" role="status">${options.notice}</p>`)}
${when(options.error, () => html`<p class="error" role="alert">${options.error}</p>`)}
${body}
</main>
</body>
</html>`;
}

export function csrfField(user: PageUser): SafeHtml {
  return html`<input type="hidden" name="_csrf" value="${user.csrf}">`;
}

/** A wide table scrolls inside its own focusable region on a narrow screen. */
export function table(label: string, head: string[], rows: SafeHtml[]): SafeHtml {
  return html`<div class="scroll" role="region" aria-label="${label}" tabindex="0"><table>
<thead><tr>${head.map((h) => html`<th scope="col">${h}</th>`)}</tr></thead>
<tbody>${rows.length ? rows : html`<tr><td colspan="${head.length}">Nothing here yet.</td></tr>`}</tbody>
</table></div>`;
}

/**
 * The dashboard's stylesheet and its one small script, served by mailroom itself. They
 * live in TypeScript so that they ship in every build with no copy step.
 */
export const APP_CSS = `
:root { --fg: #1a1a1a; --muted: #555; --bg: #fff; --line: #d0d0d0; --accent: #1d4ed8; --ok: #166534; --bad: #b91c1c; --soft: #f3f4f6; }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
a { color: var(--accent); }
.skip { position: absolute; left: -999px; }
.skip:focus { left: 8px; top: 8px; background: #fff; padding: 4px 8px; z-index: 10; }
.top { display: flex; flex-wrap: wrap; align-items: center; gap: 8px 16px; padding: 8px 16px; border-bottom: 1px solid var(--line); background: var(--soft); }
.brand { font-weight: 700; text-decoration: none; color: var(--fg); }
.top nav ul { display: flex; flex-wrap: wrap; gap: 4px 12px; list-style: none; margin: 0; padding: 0; }
.top nav a { text-decoration: none; padding: 4px 2px; }
.top nav a[aria-current="page"] { font-weight: 700; border-bottom: 2px solid var(--accent); }
.signout { margin-left: auto; display: flex; gap: 8px; align-items: center; }
.who { color: var(--muted); font-size: 14px; overflow-wrap: anywhere; }
main { padding: 16px; max-width: 1200px; margin: 0 auto; }
h1 { font-size: 1.6rem; margin: 8px 0 16px; overflow-wrap: anywhere; }
h2 { font-size: 1.25rem; margin: 24px 0 8px; }
.notice { background: #ecfdf5; border: 1px solid #a7f3d0; color: var(--ok); padding: 8px 12px; }
.error { background: #fef2f2; border: 1px solid #fecaca; color: var(--bad); padding: 8px 12px; overflow-wrap: anywhere; }
.secret { font-family: ui-monospace, monospace; background: var(--soft); padding: 8px; overflow-wrap: anywhere; border: 1px solid var(--line); }
form.inline, .filters { display: flex; flex-wrap: wrap; gap: 8px; align-items: flex-end; margin: 8px 0 16px; }
label { display: block; font-weight: 600; font-size: 14px; }
.field { display: flex; flex-direction: column; gap: 2px; margin-bottom: 12px; min-width: 0; max-width: 100%; }
.field.check { flex-direction: row; align-items: center; gap: 8px; }
input[type=text], input[type=url], input[type=email], input[type=search], input[type=password], input[type=datetime-local], select, textarea {
  font: inherit; padding: 6px 8px; border: 1px solid #767676; border-radius: 4px; max-width: 100%; background: #fff; color: var(--fg); }
textarea { width: 100%; min-height: 16rem; font-family: ui-monospace, monospace; font-size: 14px; }
button, .button { font: inherit; padding: 6px 14px; border-radius: 4px; border: 1px solid var(--accent); background: var(--accent); color: #fff; cursor: pointer; text-decoration: none; display: inline-block; }
button.secondary { background: #fff; color: var(--accent); }
button.danger { background: var(--bad); border-color: var(--bad); }
button.link { background: none; border: none; color: var(--accent); padding: 0; text-decoration: underline; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; width: 100%; font-size: 15px; }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
td.value { font-family: ui-monospace, monospace; font-size: 13px; overflow-wrap: anywhere; max-width: 40rem; }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; background: var(--soft); border: 1px solid var(--line); font-size: 13px; }
.badge.VERIFIED, .badge.succeeded, .badge.enabled, .badge.delivered, .badge.SENT, .badge.SUBSCRIBED, .badge.opened, .badge.clicked { color: var(--ok); border-color: #86efac; }
.badge.FAILED, .badge.bounced, .badge.failed, .badge.complained, .badge.BOUNCED, .badge.COMPLAINED { color: var(--bad); border-color: #fca5a5; }
fieldset.events { display: grid; grid-template-columns: repeat(auto-fill, minmax(14rem, 1fr)); gap: 0 16px; margin: 0 0 12px; border: 1px solid var(--line); min-width: 0; }
fieldset.events .field { margin-bottom: 6px; }
dl.facts { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 4px 16px; }
dl.facts dt { font-weight: 600; }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
.split { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 16px; }
iframe.preview { width: 100%; min-height: 28rem; border: 1px solid var(--line); background: #fff; }
ol.timeline { list-style: none; padding: 0; border-left: 2px solid var(--line); }
ol.timeline li { padding: 4px 0 4px 12px; overflow-wrap: anywhere; }
.pager { display: flex; gap: 16px; margin: 12px 0; }
progress, meter { width: 100%; max-width: 32rem; height: 1.25rem; }
.muted { color: var(--muted); }
@media (max-width: 700px) {
  .split { grid-template-columns: minmax(0, 1fr); }
  .signout { margin-left: 0; }
  main { padding: 12px; }
  h1 { font-size: 1.35rem; }
}
`;

/**
 * Copy buttons, and the browser's own time zone preselected when scheduling. Everything
 * else is plain HTML forms and htmx attributes.
 */
export const APP_JS = `
document.addEventListener('click', function (event) {
  var button = event.target.closest && event.target.closest('button[data-copy]');
  if (!button) return;
  event.preventDefault();
  var done = function () { button.textContent = 'Copied'; setTimeout(function () { button.textContent = 'Copy'; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(button.getAttribute('data-copy')).then(done, done);
  else {
    var area = document.createElement('textarea');
    area.value = button.getAttribute('data-copy');
    document.body.appendChild(area); area.select();
    try { document.execCommand('copy'); } catch (e) {}
    area.remove(); done();
  }
});
document.addEventListener('DOMContentLoaded', function () {
  var zone = document.querySelector('select[data-browser-zone]');
  if (!zone) return;
  try {
    var mine = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (mine && zone.querySelector('option[value="' + mine + '"]')) zone.value = mine;
  } catch (e) {}
});
`;

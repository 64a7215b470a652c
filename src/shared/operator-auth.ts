import { safeEqual, sha256Hex } from './crypto.js';

/** The one operator account: the dashboard and /metrics (docs/operations.md "Metrics"). */
export const OPERATOR_USER = 'admin';

export const OPERATOR_CHALLENGE = 'Basic realm="mailroom operators", charset="UTF-8"';

/** The user and password of an `Authorization: Basic` header; undefined for any other scheme. */
function basicCredentials(header: string | undefined): { user: string; password: string } | undefined {
  const match = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header ?? '');
  if (!match) return undefined;
  const decoded = Buffer.from(match[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 0) return undefined;
  return { user: decoded.slice(0, colon), password: decoded.slice(colon + 1) };
}

/**
 * Whether an Authorization header carries `admin` / ADMIN_PASSWORD as HTTP basic auth. An API
 * bearer token is never accepted. Both parts are compared in constant time on their SHA-256
 * (so not even the length leaks), and both are always compared.
 */
export function isOperator(header: string | undefined, password: string): boolean {
  const given = basicCredentials(header);
  const userOk = safeEqual(sha256Hex(given?.user ?? ''), sha256Hex(OPERATOR_USER));
  const passwordOk = safeEqual(sha256Hex(given?.password ?? ''), sha256Hex(password));
  return given !== undefined && userOk && passwordOk;
}

/** Whether a peer address is this host (127.0.0.0/8, ::1, or either mapped into IPv6). */
export function isLoopback(address: string | undefined): boolean {
  if (!address) return false;
  const bare = address.startsWith('::ffff:') ? address.slice(7) : address;
  return bare === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(bare);
}

type RequestHeaders = Record<string, string | string[] | undefined>;

/**
 * Whether a request came through a proxy (it names the client it forwards): a reverse proxy or
 * load balancer on this host connects from loopback on behalf of anyone.
 */
function forwardedByProxy(headers: RequestHeaders): boolean {
  return headers['x-forwarded-for'] !== undefined || headers.forwarded !== undefined || headers['x-real-ip'] !== undefined;
}

/**
 * Who may read /metrics (API and worker): with ADMIN_PASSWORD, the operator's basic auth;
 * without it, only this host (a scraper on the same machine, not a client a proxy on it
 * forwards), since the API port is the public one and the figures are the operator's business.
 */
export function metricsAccess(config: { adminPassword?: string }, peer: string | undefined, headers: RequestHeaders): 'ok' | 'credentials' | 'local-only' {
  const authorization = typeof headers.authorization === 'string' ? headers.authorization : undefined;
  if (config.adminPassword) return isOperator(authorization, config.adminPassword) ? 'ok' : 'credentials';
  return isLoopback(peer) && !forwardedByProxy(headers) ? 'ok' : 'local-only';
}

export const METRICS_LOCAL_ONLY =
  'GET /metrics is answered to this host only while ADMIN_PASSWORD is unset (not through a proxy: X-Forwarded-For, Forwarded or X-Real-IP); set ADMIN_PASSWORD to scrape from elsewhere';

import { safeEqual, sha256Hex } from './crypto.js';

/** The one operator account: the dashboard and /metrics (contract 14). */
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

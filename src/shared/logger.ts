import { pino, type Logger } from 'pino';

export type { Logger };

// Paths pino removes from every line, wherever a request, a job or a config is logged.
const REDACT = [
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["x-mailroom-signature"]',
  'headers.authorization',
  'authorization',
  'token',
  'secret',
  'password',
  'secretKey',
  'config.secretKey',
  'config.adminPassword',
  'config.providerWebhookSecret',
  'config.mail.smtpUrl',
  // These URLs may carry a password (postgres://user:pass@..., redis://:pass@...).
  'config.databaseUrl',
  'config.redisUrl',
  'smtpUrl',
  '*.token',
  '*.secret',
  '*.password',
  '*.privateKey',
];

// Public paths whose next segments are a capability (a signed token: unsubscribe,
// confirmation, tracking): whoever reads the log could use it.
const CAPABILITY_PATH = /^(\/(?:u|confirm|t\/[oc])\/)[^?#]+/;

// An API token wherever it appears in a URL (a client that put one in the query string).
const API_TOKEN = /svc_[A-Za-z0-9]{8,}/g;

/**
 * A request URL as logged: the token of a capability path replaced, the path matched as the
 * router matches it (percent-decoded: `/%75/{token}` is `/u/{token}`), and any API token.
 */
export function redactUrl(url: unknown): unknown {
  if (typeof url !== 'string') return url;
  const end = url.search(/[?#]/);
  const path = end === -1 ? url : url.slice(0, end);
  let decoded = path;
  try {
    decoded = decodeURIComponent(path);
  } catch {
    // Not valid percent-encoding: the router refuses it (404) as it is.
  }
  const shown = CAPABILITY_PATH.test(decoded) ? decoded.replace(CAPABILITY_PATH, '$1[redacted]') : path;
  return (shown + (end === -1 ? '' : url.slice(end))).replace(API_TOKEN, 'svc_[redacted]');
}

interface LoggedRequest {
  method?: string;
  url?: string;
  ip?: string;
  host?: string;
  headers?: Record<string, unknown>;
  socket?: { remotePort?: number };
  raw?: unknown;
}

/**
 * `req` as logged: Fastify's own fields (its serializer is replaced by this one, which the
 * logger instance's serializers take precedence over) with the URL redacted; a plain
 * object logged as `req` keeps its fields, the URL redacted too.
 */
function serializeRequest(req: LoggedRequest): Record<string, unknown> {
  if (!req || typeof req !== 'object') return req as never;
  if (!('raw' in req)) return { ...req, url: redactUrl(req.url) };
  return {
    method: req.method,
    url: redactUrl(req.url),
    version: req.headers?.['accept-version'],
    host: req.host,
    remoteAddress: req.ip,
    remotePort: req.socket?.remotePort,
  };
}

export function createLogger(options: { level: string; name?: string }): Logger {
  return pino({
    name: options.name ?? 'mailroom',
    level: options.level,
    redact: { paths: REDACT, censor: '[redacted]' },
    serializers: { req: serializeRequest },
  });
}

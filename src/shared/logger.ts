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

export function createLogger(options: { level: string; name?: string }): Logger {
  return pino({
    name: options.name ?? 'mailroom',
    level: options.level,
    redact: { paths: REDACT, censor: '[redacted]' },
  });
}

import { availableParallelism } from 'node:os';
import { z } from 'zod';
import { wholeNumber } from './whole-number.js';
import { normalizeHostname } from './domains/hostname.js';
import { sendgridKey } from './providers/sendgrid.js';
import { QUEUE_NAMES } from './queues/registry.js';

// Used only outside production, so that `npm install && npm start` runs with no setup.
// Start-up logs a warning whenever it is in use.
export const DEVELOPMENT_SECRET_KEY = 'mailroom-development-secret-key-do-not-use-in-production';

const booleanish = z
  .enum(['true', 'false', '1', '0', 'yes', 'no', 'on', 'off'])
  .transform((v) => ['true', '1', 'yes', 'on'].includes(v));

/**
 * An integer variable in decimal digits (shared/whole-number.ts), then `refine`d (min, max, with
 * their own messages): Number() alone would take `0x10` or `1e3`, almost certainly typos,
 * silently (docs/operations.md: an invalid value stops start-up).
 */
const integer = (refine: (n: z.ZodNumber) => z.ZodNumber) => wholeNumber(refine(z.number().int()), { variable: true });

const optionalPositiveInt = integer((n) => n.positive()).optional();

// Checked as a whole URL (a port that is not a number, say): one that passes the scheme check
// and fails later would stop start-up with a stack trace holding its password. The message
// never repeats the value.
const connectionUrl = (scheme: RegExp, expected: string) =>
  z.string().superRefine((v, ctx) => {
    if (!scheme.test(v)) ctx.addIssue({ code: 'custom', message: expected });
    else if (!URL.canParse(v)) ctx.addIssue({ code: 'custom', message: 'is not a valid URL (check its port, and percent-encode any special character of the password)' });
  });

function isSendgridKey(value: string): boolean {
  try {
    sendgridKey(value);
    return true;
  } catch {
    return false;
  }
}

const hostPort = z
  .string()
  .regex(/^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+|[0-9a-fA-F:]+)(:\d{1,5})?$/, 'expected host or host:port')
  // A bracketed IPv6 host or a host name with a port: the port is a TCP/UDP port (1 to 65535).
  .refine((v) => {
    const port = /(?:^\[[^\]]+\]|^[^:]+):(\d+)$/.exec(v)?.[1];
    return port === undefined || (Number(port) >= 1 && Number(port) <= 65535);
  }, 'the port must be 1 to 65535');

const envSchema = z
  .object({
    NODE_ENV: z.enum(['development', 'production', 'test']).default('development'),
    DATABASE_URL: connectionUrl(/^postgres(ql)?:\/\//, 'expected a postgres:// URL').default('postgres://postgres@127.0.0.1:5432/mailroom'),
    // Named (server-side) prepared statements on the hot paths. A connection pooler in
    // transaction mode that does not track them (PgBouncer before 1.21, or without
    // max_prepared_statements) hands a statement to a server connection that never prepared it:
    // set false there.
    DATABASE_PREPARED_STATEMENTS: booleanish.default(true),
    REDIS_URL: connectionUrl(/^rediss?:\/\//, 'expected a redis:// or rediss:// URL').default('redis://127.0.0.1:6379'),
    // Every Redis key of the service starts with this, so several installations (or the
    // test suite) can share one Redis without seeing each other's queues.
    REDIS_PREFIX: z
      .string()
      .regex(/^[A-Za-z0-9_-]{1,64}$/, 'letters, digits, _ and - only')
      .default('mailroom'),
    HOST: z.string().min(1).default('127.0.0.1'),
    PORT: integer((n) => n.min(0).max(65535)).default(3000),
    // Default: http://localhost:{PORT}, so links follow the port.
    PUBLIC_URL: z.url({ protocol: /^https?$/ }).optional(),
    SECRET_KEY: z.string().min(32, 'must be at least 32 characters').optional(),
    MAIL_TRANSPORT: z.enum(['file', 'smtp']).default('file'),
    MAIL_OUTBOX_DIR: z.string().min(1).default('./data/outbox'),
    SMTP_URL: connectionUrl(/^smtps?:\/\//, 'expected an smtp:// or smtps:// URL').optional(),
    DNS_SERVERS: z
      .string()
      .optional()
      .transform((v, ctx) => {
        if (v === undefined || v.trim() === '') return undefined;
        const servers = v.split(',').map((s) => s.trim());
        for (const s of servers) {
          const checked = hostPort.safeParse(s);
          if (!checked.success) {
            ctx.addIssue({ code: 'custom', message: `invalid server "${s}": ${checked.error.issues[0]?.message ?? 'expected host or host:port'}` });
            return z.NEVER;
          }
        }
        return servers;
      }),
    VERIFY_MONTHLY_QUOTA: integer((n) => n.min(0)).default(1000),
    // Campaign fan-out: subscribers read, and email rows written, per statement (page).
    CAMPAIGN_FANOUT_PAGE: integer((n) => n.min(1).max(5000)).default(5000),
    // Operator blocklist of verification: comma-separated domains (and their subdomains)
    // answered `spam_domain`.
    VERIFY_BLOCKED_DOMAINS: z
      .string()
      .optional()
      .transform((v, ctx) => {
        const domains: string[] = [];
        for (const entry of (v ?? '').split(',').map((s) => s.trim()).filter(Boolean)) {
          const domain = normalizeHostname(entry);
          if (domain) domains.push(domain);
          else ctx.addIssue({ code: 'custom', message: `"${entry.slice(0, 100)}" is not a domain name (expected a comma-separated list such as mailinator.com,example.org)` });
        }
        return domains;
      }),
    RATE_LIMIT_PER_SECOND: integer((n) => n.positive()).default(50),
    MAIL_RATE_PER_SECOND: optionalPositiveInt,
    SMTP_MAX_CONNECTIONS: integer((n) => n.min(1).max(1000)).default(16),
    // Threads of a worker process that render and build the mail it delivers (docs/operations.md
    // "Delivery threads"); 0: on the event loop. One by default where there are cores to spare:
    // on two, shared with PostgreSQL, Redis and the relay, it measured +5-12 % for 50-90 MiB.
    DELIVERY_THREADS: integer((n) => n.min(0).max(64)).default(availableParallelism() >= 4 ? 1 : 0),
    // V8's heap growth between major collections (docs/operations.md "Memory"); 0: V8's own.
    HEAP_GROWING_PERCENT: integer((n) => n.min(0).max(1000)).default(100),
    EMAIL_RECONCILE_EVERY_MS: optionalPositiveInt,
    EMAIL_RECONCILE_GRACE_MS: integer((n) => n.min(0)).optional(),
    WORKER_QUEUES: z
      .string()
      .optional()
      .transform((v, ctx) => {
        if (v === undefined || v.trim() === '' || v.trim() === 'all') return undefined;
        const queues = v.split(',').map((s) => s.trim()).filter(Boolean);
        const unknown = queues.filter((q) => !(QUEUE_NAMES as string[]).includes(q));
        if (unknown.length > 0) {
          ctx.addIssue({ code: 'custom', message: `unknown queue ${unknown.join(', ')} (the queues: ${QUEUE_NAMES.join(', ')}, or all)` });
          return z.NEVER;
        }
        return queues;
      }),
    WORKER_METRICS_PORT: integer((n) => n.min(0).max(65535)).optional(),
    PROVIDER_WEBHOOK_SECRET: z.string().min(1).optional(),
    // The providers' own webhooks (docs/outcomes.md). Each provider's endpoint answers 404
    // until its secret is set; SES is on by default (its SNS signature is the proof), and
    // SES_SNS_TOPIC_ARNS narrows it to the topics of this installation.
    SNS_CERT_HOST_PATTERN: z
      .string()
      .default('^sns\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?$')
      .transform((v, ctx) => {
        try {
          return new RegExp(v, 'i');
        } catch {
          ctx.addIssue({ code: 'custom', message: 'is not a valid regular expression' });
          return z.NEVER;
        }
      }),
    SES_WEBHOOK_ENABLED: booleanish.default(true),
    SES_SNS_TOPIC_ARNS: z
      .string()
      .optional()
      .transform((v) => (v ?? '').split(',').map((s) => s.trim()).filter(Boolean)),
    POSTMARK_WEBHOOK_USER: z.string().min(1).optional(),
    POSTMARK_WEBHOOK_PASSWORD: z.string().min(1).optional(),
    MAILGUN_WEBHOOK_SIGNING_KEY: z.string().min(1).optional(),
    SENDGRID_WEBHOOK_PUBLIC_KEY: z
      .string()
      .min(1)
      .refine((v) => isSendgridKey(v), "is not SendGrid's verification key (the base64 public key of its Signed Event Webhook, or a PEM)")
      .optional(),
    ADMIN_PASSWORD: z.string().min(1).optional(),
    ALLOW_UNVERIFIED_DOMAINS: booleanish.optional(),
    LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    // SMTP submission (docs/smtp.md): the listener, its TLS and its size limit.
    SMTP_SUBMISSION_HOST: z.string().min(1).default('127.0.0.1'),
    SMTP_SUBMISSION_PORT: integer((n) => n.min(0).max(65535)).default(2587),
    SMTP_SUBMISSION_TLS_PORT: integer((n) => n.min(0).max(65535)).optional(),
    SMTP_TLS_CERT_FILE: z.string().min(1).optional(),
    SMTP_TLS_KEY_FILE: z.string().min(1).optional(),
    SMTP_MAX_MESSAGE_BYTES: integer((n) => n.min(1024).max(1024 * 1024 * 1024)).default(10 * 1024 * 1024),
    // Security hardening (docs/security.md): limits per organization, whatever its tokens.
    // Requests a second per organization, every token and interface together; unset: 4 x RATE_LIMIT_PER_SECOND.
    RATE_LIMIT_ORG_PER_SECOND: optionalPositiveInt,
    MAX_TOKENS_PER_ORGANIZATION: integer((n) => n.positive()).default(50),
    MAX_DOMAINS_PER_ORGANIZATION: integer((n) => n.positive()).default(20),
    MAX_WEBHOOKS_PER_ORGANIZATION: integer((n) => n.positive()).default(20),
    TEST_SENDS_PER_HOUR: integer((n) => n.min(0)).default(20),
    // Where the generated SECRET_KEY of a non-production install is kept (created 0600 on first start).
    SECRET_KEY_FILE: z.string().min(1).default('./data/secret-key'),
    // Bounces and complaints by mail (docs/outcomes.md): the inbound SMTP listener and the
    // return-path host of mail from domains an organization does not own (default: the host
    // of PUBLIC_URL).
    INBOUND_SMTP_HOST: z.string().min(1).default('127.0.0.1'),
    INBOUND_SMTP_PORT: integer((n) => n.min(0).max(65535)).default(2525),
    // At most 50 MiB: a report is stored once per recipient (up to 10) in one statement, which
    // PostgreSQL caps at 1 GB; a bigger one would be answered 451 at every try and never stored.
    INBOUND_MAX_MESSAGE_BYTES: integer((n) => n.min(1024).max(50 * 1024 * 1024, 'at most 52428800 (50 MiB)')).default(10 * 1024 * 1024),
    // A message is held in memory until stored: connections x size bounds the memory used.
    INBOUND_MAX_CONNECTIONS: integer((n) => n.positive()).default(50),
    // PEM paths: with both, the inbound listener offers STARTTLS; without, it does not.
    INBOUND_TLS_KEY: z.string().min(1).optional(),
    INBOUND_TLS_CERT: z.string().min(1).optional(),
    BOUNCE_DOMAIN: z
      .string()
      .transform((v, ctx) => normalizeHostname(v) ?? (ctx.addIssue({ code: 'custom', message: 'expected a host name' }), z.NEVER))
      .optional(),
    // Webhooks (docs/webhooks.md "Input rules"): allow endpoint URLs whose host is
    // loopback/private/link-local.
    WEBHOOK_ALLOW_PRIVATE_URLS: booleanish.optional(),
    // Operator essentials: retention of old rows (purge-expired) and the From address of the
    // service's own mail (double opt-in confirmations of an organization without a sender).
    EMAIL_RETENTION_DAYS: integer((n) => n.min(1, 'must be at least 1 (days)').max(36_500)).default(30),
    SYSTEM_FROM: z
      .string()
      .trim()
      .regex(/^[^\s@<>"]+@[^\s@<>".]+(\.[^\s@<>".]+)+$/, 'expected an address such as no-reply@mail.example.com')
      .optional(),
  })
  .superRefine((env, ctx) => {
    if (env.NODE_ENV === 'production' && !env.SECRET_KEY) {
      ctx.addIssue({ code: 'custom', path: ['SECRET_KEY'], message: 'is required when NODE_ENV=production' });
    }
    if (Boolean(env.POSTMARK_WEBHOOK_USER) !== Boolean(env.POSTMARK_WEBHOOK_PASSWORD)) {
      const missing = env.POSTMARK_WEBHOOK_USER ? 'POSTMARK_WEBHOOK_PASSWORD' : 'POSTMARK_WEBHOOK_USER';
      ctx.addIssue({ code: 'custom', path: [missing], message: 'is required with the other Postmark webhook setting' });
    }
    if (env.MAIL_TRANSPORT === 'smtp' && !env.SMTP_URL) {
      ctx.addIssue({ code: 'custom', path: ['SMTP_URL'], message: 'is required when MAIL_TRANSPORT=smtp' });
    }
    if ((env.SMTP_TLS_CERT_FILE === undefined) !== (env.SMTP_TLS_KEY_FILE === undefined)) {
      const missing = env.SMTP_TLS_CERT_FILE === undefined ? 'SMTP_TLS_CERT_FILE' : 'SMTP_TLS_KEY_FILE';
      ctx.addIssue({ code: 'custom', path: [missing], message: 'is required with the other of SMTP_TLS_CERT_FILE and SMTP_TLS_KEY_FILE' });
    }
    if ((env.INBOUND_TLS_KEY === undefined) !== (env.INBOUND_TLS_CERT === undefined)) {
      const missing = env.INBOUND_TLS_KEY === undefined ? 'INBOUND_TLS_KEY' : 'INBOUND_TLS_CERT';
      ctx.addIssue({ code: 'custom', path: [missing], message: 'is required with the other of INBOUND_TLS_KEY and INBOUND_TLS_CERT' });
    }
    if (env.SMTP_SUBMISSION_TLS_PORT !== undefined && env.SMTP_TLS_CERT_FILE === undefined) {
      ctx.addIssue({ code: 'custom', path: ['SMTP_SUBMISSION_TLS_PORT'], message: 'needs SMTP_TLS_CERT_FILE and SMTP_TLS_KEY_FILE' });
    }
  });

export type Env = z.input<typeof envSchema>;

export interface Config {
  nodeEnv: 'development' | 'production' | 'test';
  databaseUrl: string;
  /** DATABASE_PREPARED_STATEMENTS. */
  databasePreparedStatements: boolean;
  redisUrl: string;
  /** `{REDIS_PREFIX}`: the start of every Redis key, braces included (a hash tag). */
  redisPrefix: string;
  host: string;
  port: number;
  publicUrl: string;
  secretKey: string;
  usingDevelopmentSecret: boolean;
  mail: {
    transport: 'file' | 'smtp';
    outboxDir: string;
    smtpUrl?: string;
    ratePerSecond?: number;
    /** SMTP connections to the relay a sending process keeps open at most. */
    maxConnections: number;
    /** Threads of a sending process that render and build its messages (0: its event loop). */
    threads: number;
  };
  dnsServers?: string[];
  verifyMonthlyQuota: number;
  campaignFanoutPage: number;
  verifyBlockedDomains: string[];
  rateLimitPerSecond: number;
  workerQueues?: string[];
  /** V8's heap growing factor, in percent over 1 (0: V8's own heuristic); set at boot. */
  heapGrowingPercent: number;
  workerMetricsPort?: number;
  /** How often the email reconciler runs, and how old a queued email must be for it. */
  emailReconcileEveryMs?: number;
  emailReconcileGraceMs?: number;
  providerWebhookSecret?: string;
  /** The providers' own webhooks; a provider without its secret is off (404). */
  providers: {
    snsCertHostPattern: RegExp;
    ses: { enabled: boolean; topicArns: string[] };
    postmark?: { user: string; password: string };
    mailgunSigningKey?: string;
    sendgridPublicKey?: string;
  };
  adminPassword?: string;
  allowUnverifiedDomains: boolean;
  logLevel: string;
  /** SMTP submission (docs/smtp.md). */
  smtpSubmission: {
    host: string;
    port: number;
    /** Implicit TLS listener, when set. */
    tlsPort?: number;
    certFile?: string;
    keyFile?: string;
    maxMessageBytes: number;
  };
  // Security hardening (docs/security.md).
  rateLimitOrgPerSecond: number;
  maxTokensPerOrganization: number;
  maxDomainsPerOrganization: number;
  /** MAX_WEBHOOKS_PER_ORGANIZATION: one organization's endpoints never take every webhook job slot of a worker (docs/webhooks.md). */
  maxWebhooksPerOrganization: number;
  testSendsPerHour: number;
  secretKeyFile: string;
  /** Bounces and complaints by mail: the inbound SMTP listener and the return-path host. */
  inbound: {
    host: string;
    port: number;
    maxMessageBytes: number;
    maxConnections: number;
    bounceDomain: string;
    /** PEM key and certificate files: STARTTLS is offered when both are set. */
    tlsKeyFile: string | undefined;
    tlsCertFile: string | undefined;
  };
  /** Webhooks: endpoint URLs may resolve to private addresses (default: outside production). */
  webhookAllowPrivateUrls: boolean;
  /** Emails, their events and verification results older than this are purged. */
  emailRetentionDays: number;
  /** From address of the service's own mail (SYSTEM_FROM or derived from PUBLIC_URL). */
  systemFrom: string;
}

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

/** Parses the environment once. Throws a ConfigError that names every invalid variable. */
export function loadConfig(source: Record<string, string | undefined> = process.env): Config {
  // An empty (or blank) variable means "not set", as in most twelve-factor tools: `PORT=' '`
  // is the default port, not port 0.
  const env = Object.fromEntries(Object.entries(source).filter(([, v]) => v !== undefined && v.trim() !== ''));
  const parsed = envSchema.safeParse(env);
  if (!parsed.success) {
    throw new ConfigError(
      parsed.error.issues.map((issue) => `${String(issue.path[0] ?? 'environment')}: ${issue.message}`),
    );
  }
  const e = parsed.data;
  const publicUrl = (e.PUBLIC_URL ?? `http://localhost:${e.PORT}`).replace(/\/+$/, '');
  return {
    nodeEnv: e.NODE_ENV,
    databaseUrl: e.DATABASE_URL,
    databasePreparedStatements: e.DATABASE_PREPARED_STATEMENTS,
    redisUrl: e.REDIS_URL,
    // In braces: a Redis Cluster hash tag, so every key of the installation (BullMQ's queues,
    // whose scripts touch several keys at once, and ours) lands in one slot (README "Running in production").
    redisPrefix: `{${e.REDIS_PREFIX}}`,
    host: e.HOST,
    port: e.PORT,
    publicUrl,
    secretKey: e.SECRET_KEY ?? DEVELOPMENT_SECRET_KEY,
    usingDevelopmentSecret: e.SECRET_KEY === undefined,
    mail: {
      transport: e.MAIL_TRANSPORT,
      outboxDir: e.MAIL_OUTBOX_DIR,
      smtpUrl: e.SMTP_URL,
      ratePerSecond: e.MAIL_RATE_PER_SECOND,
      maxConnections: e.SMTP_MAX_CONNECTIONS,
      threads: e.DELIVERY_THREADS,
    },
    dnsServers: e.DNS_SERVERS,
    verifyMonthlyQuota: e.VERIFY_MONTHLY_QUOTA,
    campaignFanoutPage: e.CAMPAIGN_FANOUT_PAGE,
    verifyBlockedDomains: e.VERIFY_BLOCKED_DOMAINS,
    rateLimitPerSecond: e.RATE_LIMIT_PER_SECOND,
    workerQueues: e.WORKER_QUEUES,
    heapGrowingPercent: e.HEAP_GROWING_PERCENT,
    workerMetricsPort: e.WORKER_METRICS_PORT,
    emailReconcileEveryMs: e.EMAIL_RECONCILE_EVERY_MS,
    emailReconcileGraceMs: e.EMAIL_RECONCILE_GRACE_MS,
    providerWebhookSecret: e.PROVIDER_WEBHOOK_SECRET,
    providers: {
      snsCertHostPattern: e.SNS_CERT_HOST_PATTERN,
      ses: { enabled: e.SES_WEBHOOK_ENABLED, topicArns: e.SES_SNS_TOPIC_ARNS },
      ...(e.POSTMARK_WEBHOOK_USER && e.POSTMARK_WEBHOOK_PASSWORD
        ? { postmark: { user: e.POSTMARK_WEBHOOK_USER, password: e.POSTMARK_WEBHOOK_PASSWORD } }
        : {}),
      mailgunSigningKey: e.MAILGUN_WEBHOOK_SIGNING_KEY,
      sendgridPublicKey: e.SENDGRID_WEBHOOK_PUBLIC_KEY,
    },
    adminPassword: e.ADMIN_PASSWORD,
    allowUnverifiedDomains: e.ALLOW_UNVERIFIED_DOMAINS ?? e.NODE_ENV !== 'production',
    logLevel: e.LOG_LEVEL,
    smtpSubmission: {
      host: e.SMTP_SUBMISSION_HOST,
      port: e.SMTP_SUBMISSION_PORT,
      tlsPort: e.SMTP_SUBMISSION_TLS_PORT,
      certFile: e.SMTP_TLS_CERT_FILE,
      keyFile: e.SMTP_TLS_KEY_FILE,
      maxMessageBytes: e.SMTP_MAX_MESSAGE_BYTES,
    },
    rateLimitOrgPerSecond: e.RATE_LIMIT_ORG_PER_SECOND ?? 4 * e.RATE_LIMIT_PER_SECOND,
    maxTokensPerOrganization: e.MAX_TOKENS_PER_ORGANIZATION,
    maxDomainsPerOrganization: e.MAX_DOMAINS_PER_ORGANIZATION,
    maxWebhooksPerOrganization: e.MAX_WEBHOOKS_PER_ORGANIZATION,
    testSendsPerHour: e.TEST_SENDS_PER_HOUR,
    secretKeyFile: e.SECRET_KEY_FILE,
    inbound: {
      host: e.INBOUND_SMTP_HOST,
      port: e.INBOUND_SMTP_PORT,
      maxMessageBytes: e.INBOUND_MAX_MESSAGE_BYTES,
      maxConnections: e.INBOUND_MAX_CONNECTIONS,
      bounceDomain: e.BOUNCE_DOMAIN ?? new URL(publicUrl).hostname.toLowerCase(),
      tlsKeyFile: e.INBOUND_TLS_KEY,
      tlsCertFile: e.INBOUND_TLS_CERT,
    },
    webhookAllowPrivateUrls: e.WEBHOOK_ALLOW_PRIVATE_URLS ?? e.NODE_ENV !== 'production',
    emailRetentionDays: e.EMAIL_RETENTION_DAYS,
    systemFrom: e.SYSTEM_FROM ?? defaultSystemFrom(publicUrl),
  };
}

/**
 * `no-reply@` the host of PUBLIC_URL when it is a domain name; an IP address or a name
 * without a dot (localhost) makes no usable address, so `no-reply@localhost.localdomain`.
 */
export function defaultSystemFrom(publicUrl: string): string {
  const host = new URL(publicUrl).hostname;
  const isIp = /^[\d.]+$/.test(host) || host.startsWith('[');
  return `no-reply@${!isIp && host.includes('.') ? host : 'localhost.localdomain'}`;
}

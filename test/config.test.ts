import { generateKeyPairSync } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { describe, expect, it } from 'vitest';
import { localPublicUrl } from '../src/shared/boot.js';
import { ConfigError, DEVELOPMENT_SECRET_KEY, loadConfig } from '../src/shared/config.js';

// A verification key as SendGrid's console shows it (base64 DER of a P-256 public key).
const SENDGRID_KEY = generateKeyPairSync('ec', { namedCurve: 'prime256v1' }).publicKey.export({ type: 'spki', format: 'der' }).toString('base64');
import { runService } from './helpers/process.js';

function problems(env: Record<string, string>): string[] {
  try {
    loadConfig(env);
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return (error as ConfigError).problems;
  }
  throw new Error(`accepted ${JSON.stringify(env)}`);
}

describe('loadConfig defaults (README.md "Configuration")', () => {
  it('runs with no environment at all', () => {
    const config = loadConfig({});
    expect(config).toMatchObject({
      nodeEnv: 'development',
      databaseUrl: 'postgres://postgres@127.0.0.1:5432/mailroom',
      databasePreparedStatements: true,
      redisUrl: 'redis://127.0.0.1:6379',
      redisPrefix: '{mailroom}',
      host: '127.0.0.1',
      port: 3000,
      publicUrl: 'http://localhost:3000',
      secretKey: DEVELOPMENT_SECRET_KEY,
      usingDevelopmentSecret: true,
      mail: { transport: 'file', outboxDir: './data/outbox' },
      verifyMonthlyQuota: 1000,
      rateLimitPerSecond: 50,
      allowUnverifiedDomains: true,
      logLevel: 'info',
      heapGrowingPercent: 100,
    });
    // Unset means: system resolver, unlimited, all queues, no metrics, no webhook, no dashboard.
    expect(config.mail.smtpUrl).toBeUndefined();
    expect(config.mail.ratePerSecond).toBeUndefined();
    expect(config.dnsServers).toBeUndefined();
    expect(config.workerQueues).toBeUndefined();
    expect(config.workerMetricsPort).toBeUndefined();
    expect(config.providerWebhookSecret).toBeUndefined();
    expect(config.adminPassword).toBeUndefined();
    // One delivery thread where there are cores to spare (four or more).
    expect(config.mail.threads).toBe(availableParallelism() >= 4 ? 1 : 0);
  });

  it('treats an empty or blank variable as unset', () => {
    expect(loadConfig({ PORT: '', SECRET_KEY: '', WORKER_QUEUES: '' })).toMatchObject({ port: 3000, usingDevelopmentSecret: true });
    expect(loadConfig({ PORT: '  ', VERIFY_MONTHLY_QUOTA: '\t', INBOUND_SMTP_PORT: ' ' })).toMatchObject({ port: 3000, verifyMonthlyQuota: 1000, inbound: { port: 2525 } });
  });

  it('reads every variable', () => {
    const config = loadConfig({
      NODE_ENV: 'production',
      DATABASE_URL: 'postgresql://u:p@db:5433/mail',
      DATABASE_PREPARED_STATEMENTS: 'false',
      REDIS_URL: 'rediss://:pw@cache:6380/2',
      REDIS_PREFIX: 'mr-prod_1',
      HOST: '0.0.0.0',
      PORT: '8080',
      PUBLIC_URL: 'https://mail.example.com/',
      SECRET_KEY: 'k'.repeat(32),
      MAIL_TRANSPORT: 'smtp',
      MAIL_OUTBOX_DIR: '/var/outbox',
      SMTP_URL: 'smtp://user:pass@relay:587',
      DNS_SERVERS: '1.1.1.1, 127.0.0.1:5353,[::1]:53',
      VERIFY_MONTHLY_QUOTA: '0',
      CAMPAIGN_FANOUT_PAGE: '500',
      RATE_LIMIT_PER_SECOND: '200',
      MAIL_RATE_PER_SECOND: '14',
      WORKER_QUEUES: 'maintenance, emails',
      WORKER_METRICS_PORT: '9100',
      PROVIDER_WEBHOOK_SECRET: 'whsec',
      ADMIN_PASSWORD: 'admin-pw',
      ALLOW_UNVERIFIED_DOMAINS: 'yes',
      LOG_LEVEL: 'warn',
      VERIFY_BLOCKED_DOMAINS: 'spam.example, Junk.Example',
      SMTP_SUBMISSION_HOST: '0.0.0.0',
      SMTP_SUBMISSION_PORT: '587',
      SMTP_SUBMISSION_TLS_PORT: '465',
      SMTP_TLS_CERT_FILE: '/etc/tls/cert.pem',
      SMTP_TLS_KEY_FILE: '/etc/tls/key.pem',
      SMTP_MAX_MESSAGE_BYTES: '5242880',
      RATE_LIMIT_ORG_PER_SECOND: '300',
      MAX_TOKENS_PER_ORGANIZATION: '7',
      MAX_DOMAINS_PER_ORGANIZATION: '3',
      MAX_WEBHOOKS_PER_ORGANIZATION: '4',
      TEST_SENDS_PER_HOUR: '5',
      SECRET_KEY_FILE: '/var/lib/mailroom/secret-key',
      SNS_CERT_HOST_PATTERN: '^sns\\.example\\.test$',
      SES_SNS_TOPIC_ARNS: 'arn:aws:sns:eu-west-1:1:a, arn:aws:sns:eu-west-1:1:b',
      POSTMARK_WEBHOOK_USER: 'pm',
      POSTMARK_WEBHOOK_PASSWORD: 'pm-pw',
      MAILGUN_WEBHOOK_SIGNING_KEY: 'mg-key',
      SENDGRID_WEBHOOK_PUBLIC_KEY: SENDGRID_KEY,
      INBOUND_SMTP_HOST: '0.0.0.0',
      INBOUND_SMTP_PORT: '25',
      INBOUND_MAX_MESSAGE_BYTES: '2048',
      INBOUND_MAX_CONNECTIONS: '7',
      BOUNCE_DOMAIN: 'Bounces.Example.COM',
      WEBHOOK_ALLOW_PRIVATE_URLS: 'true',
      EMAIL_RETENTION_DAYS: '90',
      SYSTEM_FROM: 'robot@mail.example.com',
      SMTP_MAX_CONNECTIONS: '8',
      DELIVERY_THREADS: '3',
      HEAP_GROWING_PERCENT: '0',
    });
    expect(config).toEqual({
      nodeEnv: 'production',
      databaseUrl: 'postgresql://u:p@db:5433/mail',
      databasePreparedStatements: false,
      redisUrl: 'rediss://:pw@cache:6380/2',
      redisPrefix: '{mr-prod_1}',
      host: '0.0.0.0',
      port: 8080,
      publicUrl: 'https://mail.example.com',
      secretKey: 'k'.repeat(32),
      usingDevelopmentSecret: false,
      mail: { transport: 'smtp', outboxDir: '/var/outbox', smtpUrl: 'smtp://user:pass@relay:587', ratePerSecond: 14, maxConnections: 8, threads: 3 },
      dnsServers: ['1.1.1.1', '127.0.0.1:5353', '[::1]:53'],
      verifyMonthlyQuota: 0,
      campaignFanoutPage: 500,
      verifyBlockedDomains: ['spam.example', 'junk.example'],
      rateLimitPerSecond: 200,
      workerQueues: ['maintenance', 'emails'],
      heapGrowingPercent: 0,
      workerMetricsPort: 9100,
      providerWebhookSecret: 'whsec',
      providers: {
        snsCertHostPattern: /^sns\.example\.test$/i,
        ses: { enabled: true, topicArns: ['arn:aws:sns:eu-west-1:1:a', 'arn:aws:sns:eu-west-1:1:b'] },
        postmark: { user: 'pm', password: 'pm-pw' },
        mailgunSigningKey: 'mg-key',
        sendgridPublicKey: SENDGRID_KEY,
      },
      adminPassword: 'admin-pw',
      allowUnverifiedDomains: true,
      logLevel: 'warn',
      smtpSubmission: { host: '0.0.0.0', port: 587, tlsPort: 465, certFile: '/etc/tls/cert.pem', keyFile: '/etc/tls/key.pem', maxMessageBytes: 5242880 },
      rateLimitOrgPerSecond: 300,
      maxTokensPerOrganization: 7,
      maxDomainsPerOrganization: 3,
      maxWebhooksPerOrganization: 4,
      testSendsPerHour: 5,
      secretKeyFile: '/var/lib/mailroom/secret-key',
      inbound: { host: '0.0.0.0', port: 25, maxMessageBytes: 2048, maxConnections: 7, bounceDomain: 'bounces.example.com' },
      webhookAllowPrivateUrls: true,
      emailRetentionDays: 90,
      systemFrom: 'robot@mail.example.com',
    });
  });

  it('takes the return-path host of unowned domains from PUBLIC_URL unless BOUNCE_DOMAIN is set, and refuses a bad one', () => {
    expect(loadConfig({}).inbound).toEqual({ host: '127.0.0.1', port: 2525, maxMessageBytes: 10 * 1024 * 1024, maxConnections: 50, bounceDomain: 'localhost' });
    expect(loadConfig({ PUBLIC_URL: 'https://Mail.Acme.test' }).inbound.bounceDomain).toBe('mail.acme.test');
    expect(() => loadConfig({ BOUNCE_DOMAIN: 'not a host' })).toThrow(/BOUNCE_DOMAIN/);
    expect(() => loadConfig({ INBOUND_SMTP_PORT: '70000' })).toThrow(/INBOUND_SMTP_PORT/);
  });

  it('offers STARTTLS on the inbound listener with both INBOUND_TLS_KEY and INBOUND_TLS_CERT, and refuses one alone', () => {
    expect(loadConfig({ INBOUND_TLS_KEY: '/tls/key.pem', INBOUND_TLS_CERT: '/tls/cert.pem' }).inbound).toMatchObject({ tlsKeyFile: '/tls/key.pem', tlsCertFile: '/tls/cert.pem' });
    expect(() => loadConfig({ INBOUND_TLS_KEY: '/tls/key.pem' })).toThrow(/INBOUND_TLS_CERT/);
    expect(() => loadConfig({ INBOUND_TLS_CERT: '/tls/cert.pem' })).toThrow(/INBOUND_TLS_KEY/);
  });

  it('has SMTP submission on 127.0.0.1:2587 with 10 MiB messages by default', () => {
    expect(loadConfig({}).smtpSubmission).toEqual({ host: '127.0.0.1', port: 2587, maxMessageBytes: 10 * 1024 * 1024 });
  });

  it('reads WORKER_QUEUES=all as every queue', () => {
    expect(loadConfig({ WORKER_QUEUES: 'all' }).workerQueues).toBeUndefined();
  });

  it('refuses unverified domains by default in production only', () => {
    const secret = { SECRET_KEY: 's'.repeat(40) };
    expect(loadConfig({ ...secret, NODE_ENV: 'production' }).allowUnverifiedDomains).toBe(false);
    expect(loadConfig({ ...secret, NODE_ENV: 'test' }).allowUnverifiedDomains).toBe(true);
    expect(loadConfig({ ...secret, NODE_ENV: 'production', ALLOW_UNVERIFIED_DOMAINS: 'true' }).allowUnverifiedDomains).toBe(true);
    expect(loadConfig({ ALLOW_UNVERIFIED_DOMAINS: 'off' }).allowUnverifiedDomains).toBe(false);
  });
});

describe('PUBLIC_URL in production', () => {
  it('is warned about when it names this machine (unset, localhost, loopback), and not otherwise', () => {
    const key = 'x'.repeat(32);
    for (const PUBLIC_URL of [undefined, 'http://localhost:3000', 'https://127.0.0.1', 'http://[::1]:3000', 'http://mail.localhost']) {
      const config = loadConfig({ NODE_ENV: 'production', SECRET_KEY: key, ...(PUBLIC_URL ? { PUBLIC_URL } : {}) });
      expect(localPublicUrl(config), PUBLIC_URL).toMatch(/^PUBLIC_URL is .*: set it to the service's public address/);
    }
    expect(localPublicUrl(loadConfig({ NODE_ENV: 'production', SECRET_KEY: key, PUBLIC_URL: 'https://mail.example.com' }))).toBeUndefined();
    expect(localPublicUrl(loadConfig({ NODE_ENV: 'development' }))).toBeUndefined();
  });
});

describe('SECRET_KEY', () => {
  it('is required when NODE_ENV=production', () => {
    const found = problems({ NODE_ENV: 'production' });
    expect(found).toHaveLength(1);
    expect(found[0]).toMatch(/^SECRET_KEY: .*production/);
  });

  it('uses the development key, flagged, outside production', () => {
    for (const NODE_ENV of ['development', 'test']) {
      const config = loadConfig({ NODE_ENV });
      expect(config.secretKey).toBe(DEVELOPMENT_SECRET_KEY);
      expect(config.usingDevelopmentSecret).toBe(true);
    }
  });

  it('must be at least 32 characters', () => {
    expect(problems({ SECRET_KEY: 'short' })[0]).toMatch(/^SECRET_KEY: /);
    expect(loadConfig({ NODE_ENV: 'production', SECRET_KEY: 'x'.repeat(32) }).usingDevelopmentSecret).toBe(false);
  });
});

describe('integer variables', () => {
  it('take decimal digits, signed or padded, and say what is wrong in their own words', () => {
    expect(loadConfig({ PORT: '+3000', RATE_LIMIT_PER_SECOND: ' 20 ' })).toMatchObject({ port: 3000 });
    expect(problems({ PORT: '0x10' })).toEqual(['PORT: must be a whole number written in digits']);
    expect(problems({ PORT: '70000' })[0]).toMatch(/^PORT: .*65535/);
    expect(problems({ RATE_LIMIT_PER_SECOND: '0' })[0]).not.toMatch(/digits/);
  });
});

describe('an invalid variable is named', () => {
  it.each([
    ['NODE_ENV', 'staging'],
    ['DATABASE_URL', 'mysql://localhost/mailroom'],
    ['REDIS_URL', 'localhost:6379'],
    ['REDIS_PREFIX', 'has:colon'],
    ['REDIS_PREFIX', 'x'.repeat(65)],
    ['PORT', 'abc'],
    ['PORT', '70000'],
    ['PORT', '-1'],
    ['PORT', '80.5'],
    // Number() would take these (port 16, port 1000): typos, not ports.
    ['PORT', '0x10'],
    ['PORT', '1e3'],
    ['RATE_LIMIT_PER_SECOND', '1e2'],
    ['INBOUND_SMTP_PORT', '0b11'],
    ['PUBLIC_URL', 'not a url'],
    ['PUBLIC_URL', 'ftp://example.com'],
    ['SECRET_KEY', 'too-short'],
    ['MAIL_TRANSPORT', 'sendmail'],
    ['SMTP_URL', 'http://relay:25'],
    ['DNS_SERVERS', '1.1.1.1,not a server'],
    ['DNS_SERVERS', '127.0.0.1:99999'],
    ['DNS_SERVERS', '[::1]:0'],
    ['VERIFY_MONTHLY_QUOTA', '-5'],
    ['CAMPAIGN_FANOUT_PAGE', '0'],
    ['VERIFY_MONTHLY_QUOTA', 'many'],
    ['RATE_LIMIT_PER_SECOND', '0'],
    ['RATE_LIMIT_PER_SECOND', 'fast'],
    ['MAIL_RATE_PER_SECOND', '0'],
    ['MAIL_RATE_PER_SECOND', '2.5'],
    ['HEAP_GROWING_PERCENT', '-1'],
    ['HEAP_GROWING_PERCENT', '1.5'],
    ['HEAP_GROWING_PERCENT', 'lots'],
    ['DELIVERY_THREADS', '-1'],
    ['DELIVERY_THREADS', '65'],
    ['DELIVERY_THREADS', 'two'],
    ['INBOUND_MAX_MESSAGE_BYTES', String(50 * 1024 * 1024 + 1)],
    ['DATABASE_PREPARED_STATEMENTS', 'maybe'],
    ['WORKER_METRICS_PORT', '123456'],
    ['ALLOW_UNVERIFIED_DOMAINS', 'maybe'],
    ['LOG_LEVEL', 'loud'],
    ['SMTP_SUBMISSION_PORT', '70000'],
    ['SMTP_MAX_MESSAGE_BYTES', '10'],
    ['SMTP_SUBMISSION_TLS_PORT', '465'],
    ['DATABASE_URL', 'postgres://user:hunter2@127.0.0.1:notaport/db'],
    ['REDIS_URL', 'redis://:hunter2@127.0.0.1:notaport'],
    ['SENDGRID_WEBHOOK_PUBLIC_KEY', 'not-base64!!'],
    ['WORKER_QUEUES', 'emails,bogus'],
    ['VERIFY_BLOCKED_DOMAINS', 'spam.example,not a domain,,'],
    ['VERIFY_BLOCKED_DOMAINS', 'user@spam.example'],
  ])('%s=%s', (variable, value) => {
    const found = problems({ [variable]: value });
    expect(found).toHaveLength(1);
    expect(found[0].startsWith(`${variable}: `)).toBe(true);
    // The message never repeats a URL (it holds a password).
    if (value.includes('hunter2')) expect(found[0]).not.toContain('hunter2');
  });

  it('refuses an SMTP_URL that is not a URL, without repeating it', () => {
    const found = problems({ MAIL_TRANSPORT: 'smtp', SMTP_URL: 'smtp://user:hunter2@host:notaport' });
    expect(found).toEqual([expect.stringMatching(/^SMTP_URL: is not a valid URL/)]);
  });

  it('requires SMTP_TLS_CERT_FILE and SMTP_TLS_KEY_FILE together, naming the missing one', () => {
    expect(problems({ SMTP_TLS_CERT_FILE: '/etc/tls/cert.pem' })).toEqual([expect.stringMatching(/^SMTP_TLS_KEY_FILE: /)]);
    expect(problems({ SMTP_TLS_KEY_FILE: '/etc/tls/key.pem' })).toEqual([expect.stringMatching(/^SMTP_TLS_CERT_FILE: /)]);
  });

  it('requires SMTP_URL with MAIL_TRANSPORT=smtp', () => {
    expect(problems({ MAIL_TRANSPORT: 'smtp' })).toEqual([expect.stringMatching(/^SMTP_URL: .*MAIL_TRANSPORT=smtp/)]);
  });

  it('names every invalid variable at once', () => {
    const error = (() => {
      try {
        loadConfig({ PORT: 'abc', LOG_LEVEL: 'loud', REDIS_URL: 'nope' });
      } catch (e) {
        return e as ConfigError;
      }
      throw new Error('accepted');
    })();
    expect(error.problems.map((p) => p.split(':')[0]).sort()).toEqual(['LOG_LEVEL', 'PORT', 'REDIS_URL']);
    expect(error.message).toMatch(/PORT/);
    expect(error.message).toMatch(/LOG_LEVEL/);
  });
});

describe('start-up stops on an invalid variable', () => {
  it.concurrent.for([
    ['the API (npm run start:api)', 'src/api/server.ts', { PORT: 'abc' }, 'PORT'],
    ['the workers (npm run start:worker)', 'src/workers/main.ts', { NODE_ENV: 'production' }, 'SECRET_KEY'],
    ['npm start', 'src/main.ts', { LOG_LEVEL: 'loud' }, 'LOG_LEVEL'],
    ['the CLI', 'src/cli/main.ts', { REDIS_URL: 'nope' }, 'REDIS_URL'],
  ] as const)('%s exits 1 naming the variable', async ([, entry, env, variable], { expect }) => {
    // Nothing else is set: the process must stop before it connects to anything.
    const proc = runService(entry, entry.includes('cli') ? ['migrate'] : [], env);
    expect(await proc.exited).toBe(1);
    expect(proc.stderr()).toContain(variable);
    expect(proc.stderr()).toContain('Invalid configuration');
    expect(proc.stderr()).not.toMatch(/\n\s+at /); // a message, not a stack trace
  });
});

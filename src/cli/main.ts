import { parseArgs } from 'node:util';
import { destination, pino } from 'pino';
import { ConfigError, loadConfig, type Config } from '../shared/config.js';
import { resolveSecretKey } from '../shared/secret-key.js';
import { SecretBox } from '../shared/crypto.js';
import { ensureDatabase, initOrm, migrate, type Orm } from '../shared/db/orm.js';
import { isDependencyDown } from '../shared/dependency-errors.js';
import { AppError } from '../shared/errors.js';
import { createOrganization, updateOrganization } from '../shared/organizations/service.js';
import { apiTarget, callApi } from './api-client.js';
import { orgList, tokenList, tokenRevoke, type OperatorCli } from './operator.js';
import { subscribersImport } from './subscribers-import.js';
import { userCreate, userList } from './users.js';

const USAGE = `Usage: npm run --silent cli -- <command>

Operator commands (talk to the database directly):
  migrate                                   create the database if missing and apply migrations
  org create --name NAME [--double-opt-in] [--verify-quota N] [--json]
  org update ID [--name NAME] [--double-opt-in on|off] [--verify-quota N]
                [--track-opens on|off] [--track-clicks on|off]
  org list [--json]                         every organization with its token count
  token list --org ID [--json]              the organization's tokens (never their secrets)
  token revoke ID [--json]                  delete a token: every API process refuses it within 2 s
  subscribers import FILE.csv --org ORG_ID [--no-resubscribe] [--json]
                                            upsert subscribers from a CSV (columns email, name,
                                            phone, tags separated by ; or |, other columns are
                                            custom fields); progress on stderr, summary at the end
                                            (without --org: through the API, see below)
  user create --org ORG_ID --email EMAIL [--json]
                                            a dashboard user; the password is read from stdin
  user list --org ORG_ID [--json]

Operator commands need the same DATABASE_URL (and REDIS_URL, REDIS_PREFIX) as the server.

User commands (talk to the API: MAILROOM_URL, default http://127.0.0.1:3000, and MAILROOM_TOKEN):
  verify EMAIL [--json]                     verify an address (counts against the monthly quota)
  subscribers import FILE.csv [--no-resubscribe] [--json]
                                            the import above, into the token's organization
`;

class UsageError extends Error {}

function onOff(option: string, value: string | undefined): boolean | undefined {
  if (value === undefined) return undefined;
  if (value === 'on') return true;
  if (value === 'off') return false;
  throw new UsageError(`${option} takes on or off, not "${value}"`);
}

// The largest value of a PostgreSQL integer column (the organization's quota).
const MAX_COUNT = 2_147_483_647;

function count(option: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) > MAX_COUNT) throw new UsageError(`${option} takes a whole number up to ${MAX_COUNT}, not "${value}"`);
  return Number(value);
}

/** An organization's name as `org create` and `org update` take it: 1 to 100 characters. */
function orgName(value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  const name = value.trim();
  if (!name || name.length > 100) throw new UsageError('--name takes 1 to 100 characters');
  return name;
}

async function withOrm<T>(config: Config, run: (orm: Orm) => Promise<T>): Promise<T> {
  const orm = await initOrm({ databaseUrl: config.databaseUrl, poolSize: 2 });
  try {
    return await run(orm);
  } finally {
    await orm.close(true);
  }
}

async function orgCreate(config: Config, args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      name: { type: 'string' },
      'double-opt-in': { type: 'boolean', default: false },
      'verify-quota': { type: 'string' },
      json: { type: 'boolean', default: false },
    },
  });
  if (values.name === undefined) throw new UsageError('--name is required (1 to 100 characters)');
  const name = orgName(values.name)!;
  const created = await withOrm(config, (orm) =>
    createOrganization(orm.em.fork(), new SecretBox(config.secretKey), {
      name,
      doubleOptIn: values['double-opt-in'],
      verifyQuota: count('--verify-quota', values['verify-quota']) ?? config.verifyMonthlyQuota,
    }),
  );
  const result = {
    organization: { id: created.organization.id, name: created.organization.name },
    token: created.token,
  };
  if (values.json) {
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } else {
    process.stdout.write(
      `Created organization ${result.organization.id} (${result.organization.name}).\n` +
        `Its first token (permissions *), shown only now:\n\n  ${result.token.token}\n`,
    );
  }
}

async function orgUpdate(config: Config, args: string[]): Promise<void> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      name: { type: 'string' },
      'double-opt-in': { type: 'string' },
      'verify-quota': { type: 'string' },
      'track-opens': { type: 'string' },
      'track-clicks': { type: 'string' },
      json: { type: 'boolean', default: false },
    },
  });
  const id = positionals[0];
  if (!id) throw new UsageError('org update needs the organization id');
  if (positionals.length > 1) throw new UsageError(`org update takes one organization id, not "${positionals.join(' ')}"`);
  const org = await withOrm(config, (orm) =>
    updateOrganization(orm.em.fork(), id, {
      name: orgName(values.name),
      doubleOptIn: onOff('--double-opt-in', values['double-opt-in']),
      verifyQuota: count('--verify-quota', values['verify-quota']),
      trackOpens: onOff('--track-opens', values['track-opens']),
      trackClicks: onOff('--track-clicks', values['track-clicks']),
    }),
  );
  const shown = {
    id: org.id,
    name: org.name,
    doubleOptIn: org.doubleOptIn,
    verifyQuota: org.verifyQuota,
    trackOpens: org.trackOpens,
    trackClicks: org.trackClicks,
  };
  process.stdout.write(values.json ? `${JSON.stringify(shown)}\n` : `Updated ${org.id}: ${JSON.stringify(shown)}\n`);
}

async function verify(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { json: { type: 'boolean', default: false } } });
  const email = positionals[0];
  if (!email || positionals.length > 1) throw new UsageError('verify takes one address');
  const target = apiTarget();
  if (!target) throw new UsageError('set MAILROOM_TOKEN to an API token (svc_...)');
  const result = await callApi(target, 'POST', '/api/v2/verify', { email });
  if (values.json) {
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } else {
    const r = result as VerifyAnswer;
    const lines = [
      `${r.email}: ${r.result}, ${r.accept ? 'accepted' : 'rejected'}, score ${r.score ?? 'none'} (${r.status})`,
      ...r.issues.map((i) => `  ${i.severity} ${i.code}${i.retryable ? ' (retryable)' : ''}: ${i.message}`),
      ...(r.suggestion ? [`  did you mean ${r.suggestion}?`] : []),
      `  quota: ${r.quota.used}/${r.quota.limit} this month, resets ${r.quota.resets_at}`,
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
  }
  return 0;
}

interface VerifyAnswer {
  email: string;
  result: string;
  accept: boolean;
  status: string;
  score: number | null;
  suggestion: string | null;
  issues: Array<{ code: string; message: string; severity: string; retryable: boolean }>;
  quota: { used: number; limit: number; resets_at: string };
}

async function runMigrate(config: Config): Promise<void> {
  if (await ensureDatabase(config.databaseUrl)) process.stderr.write('created the database\n');
  const applied = await withOrm(config, migrate);
  process.stderr.write(applied.length ? `applied ${applied.join(', ')}\n` : 'database is up to date\n');
}

const operator: OperatorCli = {
  withOrm,
  usage: (message) => new UsageError(message),
  print: (text) => {
    process.stdout.write(`${text}\n`);
  },
  warn: (text) => {
    process.stderr.write(`${text}\n`);
  },
};

type Command = (config: Config, args: string[]) => Promise<number | void>;

/** Every command by its words ("org create", or one word such as "verify"): one line adds one. */
const COMMANDS: Record<string, Command> = {
  migrate: (config, args) => {
    if (args.length) throw new UsageError(`migrate takes no arguments, got "${args.join(' ')}"`);
    return runMigrate(config);
  },
  'org create': orgCreate,
  'org update': orgUpdate,
  'org list': (config, args) => orgList(operator, config, args),
  'token list': (config, args) => tokenList(operator, config, args),
  'token revoke': (config, args) => tokenRevoke(operator, config, args),
  'subscribers import': (config, args) => subscribersImport(config, args, (m) => new UsageError(m)),
  'user create': (config, args) => userCreate(operator, config, args),
  'user list': (config, args) => userList(operator, config, args),
  verify: (_config, args) => verify(args),
};

// Commands that seal or open no secret: no key is resolved for them, so none is generated.
const KEYLESS: readonly string[] = ['migrate', 'verify'];

export async function main(argv: string[]): Promise<number> {
  const [command, sub, ...rest] = argv;
  // Help and an unknown command read no configuration and write nothing (no key file made for
  // them). `--help` or `-h` after a command (`org create --help`) is help too.
  if (!command || command === 'help' || argv.includes('-h') || argv.includes('--help')) {
    process.stdout.write(USAGE);
    return 0;
  }
  // Own properties only: `constructor` or `toString` is no command.
  const lookup = (words: string) => (Object.hasOwn(COMMANDS, words) ? COMMANDS[words] : undefined);
  const twoWords = lookup(`${command} ${sub}`);
  const oneWord = twoWords ? undefined : lookup(command);
  const run = twoWords ? (config: Config) => twoWords(config, rest) : oneWord ? (config: Config) => oneWord(config, argv.slice(1)) : undefined;
  if (!run) {
    // The first word of commands (`org`), without one of its second words.
    const subcommands = Object.keys(COMMANDS)
      .filter((words) => words.startsWith(`${command} `))
      .map((words) => words.slice(command.length + 1));
    const problem = subcommands.length > 0 ? `${command} needs one of: ${subcommands.join(', ')}${sub === undefined ? '' : ` (not "${sub}")`}` : `unknown command: ${argv.join(' ')}`;
    process.stderr.write(`mailroom: ${problem}\n\n${USAGE}`);
    return 2;
  }
  let config: Config;
  try {
    // The same key as the service's processes (SECRET_KEY, or the generated SECRET_KEY_FILE).
    const resolved = !twoWords && KEYLESS.includes(command) ? { config: loadConfig() } : resolveSecretKey(loadConfig());
    config = resolved.config;
    // A key made now is not the server's if the server runs elsewhere, or in another directory:
    // secrets this command seals (a token's) would not open there.
    if (resolved.created) {
      process.stderr.write(
        `mailroom: SECRET_KEY is not set, and ${config.secretKeyFile} did not exist: a new key was generated there. ` +
          'Give this command the same SECRET_KEY (or SECRET_KEY_FILE) as the server, or run it in the server\'s directory, ' +
          'or the secrets it writes will not open on the server.\n',
      );
    }
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`mailroom: ${error.message}\n`);
      return 1;
    }
    throw error;
  }
  try {
    return (await run(config)) ?? 0;
  } catch (error) {
    if (error instanceof UsageError || (error instanceof TypeError && (error as { code?: string }).code?.startsWith('ERR_PARSE_ARGS'))) {
      process.stderr.write(`mailroom: ${error.message}\n\n${USAGE}`);
      return 2;
    }
    if (error instanceof AppError) {
      process.stderr.write(`mailroom: ${error.message}\n`);
      return 1;
    }
    // PostgreSQL or Redis unreachable: one line, not a stack trace (nothing was done).
    if (isDependencyDown(error)) {
      process.stderr.write(`mailroom: cannot reach PostgreSQL or Redis (${(error as Error).message}); nothing was changed\n`);
      return 1;
    }
    pino({ level: 'error' }, destination(2)).error({ err: error }, 'command failed');
    return 1;
  }
}

process.exitCode = await main(process.argv.slice(2));

import { parseArgs } from 'node:util';
import type { Config } from '../shared/config.js';
import type { Orm } from '../shared/db/orm.js';
import { NotFoundError } from '../shared/errors.js';
import { createRedis, settleConnection } from '../shared/redis.js';
import { organizationExists, selectOrganizationsWithTokenCounts } from '../shared/organizations/queries.js';
import { announceTokenChange, revokeToken } from '../shared/tokens/revoke.js';
import { listTokens } from '../shared/tokens/service.js';

/** What the operator commands need from the CLI's main module. */
export interface OperatorCli {
  withOrm<T>(config: Config, run: (orm: Orm) => Promise<T>): Promise<T>;
  usage(message: string): Error;
  print(line: string): void;
  /** A warning, on stderr (with --json too: stdout stays one JSON document). */
  warn(line: string): void;
}

function jsonFlag(args: string[]) {
  return parseArgs({ args, allowPositionals: true, options: { json: { type: 'boolean', default: false } } });
}

const iso = (date: Date) => date.toISOString();

/** `org list [--json]`: every organization, oldest first, with its token count. */
export async function orgList(cli: OperatorCli, config: Config, args: string[]): Promise<void> {
  const { values, positionals } = jsonFlag(args);
  if (positionals.length) throw cli.usage(`org list takes no arguments, got "${positionals.join(' ')}"`);
  const rows = await cli.withOrm(config, (orm) =>
    selectOrganizationsWithTokenCounts(orm.em.fork()),
  );
  const items = rows.map((r) => ({
    id: r.id,
    name: r.name,
    doubleOptIn: r.double_opt_in,
    verifyQuota: r.verify_quota,
    tokens: Number(r.tokens),
    createdAt: iso(new Date(r.created_at)),
  }));
  if (values.json) return cli.print(JSON.stringify(items));
  if (!items.length) return cli.print('No organizations yet: npm run --silent cli -- org create --name NAME');
  cli.print(items.map((o) => `${o.id}  ${o.name}  (${o.tokens} token${o.tokens === 1 ? '' : 's'}, created ${o.createdAt})`).join('\n'));
}

/** `token list --org ID [--json]`: the organization's tokens, newest first, never a secret. */
export async function tokenList(cli: OperatorCli, config: Config, args: string[]): Promise<void> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: { org: { type: 'string' }, json: { type: 'boolean', default: false } },
  });
  if (positionals.length) throw cli.usage(`token list takes --org ID, not "${positionals.join(' ')}"`);
  const organizationId = values.org?.trim();
  if (!organizationId) throw cli.usage('token list needs --org ID (see org list)');
  const tokens = await cli.withOrm(config, async (orm) => {
    const em = orm.em.fork();
    if (!(await organizationExists(em, organizationId))) return null;
    return (await listTokens(em, organizationId, undefined)).items;
  });
  if (!tokens) throw new NotFoundError(`No organization ${organizationId} (see org list)`);
  const items = tokens.map((t) => ({ id: t.id, name: t.name, last4: t.last4, permissions: t.permissions, createdAt: iso(t.createdAt) }));
  if (values.json) return cli.print(JSON.stringify(items));
  if (!items.length) return cli.print(`${organizationId} has no tokens`);
  cli.print(items.map((t) => `${t.id}  ${t.name}  svc_…${t.last4}  [${t.permissions.join(', ')}]  created ${t.createdAt}`).join('\n'));
}

/**
 * `token revoke ID [--json]`: deletes the token and announces it, so every API process
 * refuses its secret within 2 s. When Redis cannot be reached the processes still refuse
 * it once their cache entry expires (30 s); the command says so.
 */
export async function tokenRevoke(cli: OperatorCli, config: Config, args: string[]): Promise<void> {
  const { values, positionals } = jsonFlag(args);
  const id = positionals[0]?.trim();
  if (!id || positionals.length > 1) throw cli.usage('token revoke takes one token id (see token list --org ID)');
  // An unknown id is a NotFoundError: one line, exit code 1.
  const revoked = await cli.withOrm(config, (orm) => revokeToken(orm.em.fork(), null, id));
  const redis = createRedis(config.redisUrl, 'producer');
  redis.on('error', () => {});
  let announced: boolean;
  try {
    announced = (await settleConnection(redis)) && (await announceTokenChange(redis, config, revoked.organizationId));
  } finally {
    redis.disconnect();
  }
  if (values.json) {
    if (!announced) cli.warn('mailroom: Redis was not reachable: API processes refuse the token within 30 seconds, not 2.');
    // `refusedWithinSeconds`: how soon every API process refuses the secret.
    return cli.print(JSON.stringify({ object: 'token', id: revoked.id, deleted: true, refusedWithinSeconds: announced ? 2 : 30 }));
  }
  cli.print(
    announced
      ? `Revoked ${revoked.id}: API processes refuse it within 2 seconds.`
      : `Revoked ${revoked.id}, but Redis was not reachable: API processes refuse it within 30 seconds.`,
  );
}

import { parseArgs } from 'node:util';
import type { Config } from '../shared/config.js';
import { initOrm } from '../shared/db/orm.js';
import { createUser, listUsers } from '../shared/users/service.js';

async function readStdin(): Promise<string> {
  if (process.stdin.isTTY) process.stderr.write('Password (then Enter, Ctrl-D): ');
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  // One trailing newline is the end of the line, not part of the password.
  return Buffer.concat(chunks).toString('utf8').replace(/\r?\n$/, '');
}

/** `user create --org ID --email EMAIL [--json]`: the password is read from stdin. */
export async function userCreate(config: Config, args: string[], usage: (message: string) => Error): Promise<void> {
  const { values } = parseArgs({
    args,
    options: { org: { type: 'string' }, email: { type: 'string' }, json: { type: 'boolean', default: false } },
  });
  if (!values.org) throw usage('user create needs --org ORG_ID');
  if (!values.email) throw usage('user create needs --email EMAIL');
  const password = await readStdin();
  if (!password) throw usage('user create reads the password from stdin, and it was empty');
  const orm = await initOrm({ databaseUrl: config.databaseUrl, poolSize: 1 });
  try {
    const user = await createUser(orm.em.fork(), { organizationId: values.org, email: values.email, password });
    const shown = { id: user.id, organizationId: user.organizationId, email: user.email, createdAt: user.createdAt.toISOString() };
    process.stdout.write(values.json ? `${JSON.stringify(shown)}\n` : `Created user ${user.id} (${user.email}) in ${user.organizationId}.\n`);
  } finally {
    await orm.close(true);
  }
}

/** `user list --org ID [--json]` */
export async function userList(config: Config, args: string[], usage: (message: string) => Error): Promise<void> {
  const { values } = parseArgs({ args, options: { org: { type: 'string' }, json: { type: 'boolean', default: false } } });
  if (!values.org) throw usage('user list needs --org ORG_ID');
  const orm = await initOrm({ databaseUrl: config.databaseUrl, poolSize: 1 });
  try {
    const users = (await listUsers(orm.em.fork(), values.org)).map((u) => ({
      id: u.id,
      organizationId: u.organizationId,
      email: u.email,
      createdAt: u.createdAt.toISOString(),
    }));
    if (values.json) process.stdout.write(`${JSON.stringify(users)}\n`);
    else process.stdout.write(users.length ? `${users.map((u) => `${u.id}  ${u.email}  ${u.createdAt}`).join('\n')}\n` : 'No users.\n');
  } finally {
    await orm.close(true);
  }
}

import { parseArgs } from 'node:util';
import type { Config } from '../shared/config.js';
import { AppError } from '../shared/errors.js';
import { createUser, listUsers } from '../shared/users/service.js';
import type { OperatorCli } from './operator.js';

/**
 * A password typed at a terminal: read in raw mode, so the terminal does not echo it (it would
 * stay in the scrollback and in recordings of the session). Enter ends it, Backspace takes back
 * a character, Ctrl-C gives up.
 */
async function readFromTerminal(): Promise<string> {
  const input = process.stdin;
  process.stderr.write('Password (not shown; then Enter): ');
  input.setRawMode(true);
  input.resume();
  let password = '';
  try {
    return await new Promise<string>((resolve, reject) => {
      input.on('data', (chunk: Buffer) => {
        for (const character of chunk.toString('utf8')) {
          if (character === '\r' || character === '\n' || character === '\u0004') return resolve(password);
          if (character === '\u0003') return reject(new AppError(400, 'cancelled', 'cancelled: no user created'));
          if (character === '\u007f' || character === '\b') password = [...password].slice(0, -1).join('');
          else password += character;
        }
      });
    });
  } finally {
    input.removeAllListeners('data');
    input.setRawMode(false);
    input.pause();
    process.stderr.write('\n');
  }
}

async function readStdin(): Promise<string> {
  if (process.stdin.isTTY) return readFromTerminal();
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  // One trailing newline is the end of the line, not part of the password.
  return Buffer.concat(chunks).toString('utf8').replace(/\r?\n$/, '');
}

/** `user create --org ID --email EMAIL [--json]`: the password is read from stdin. */
export async function userCreate(cli: OperatorCli, config: Config, args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: { org: { type: 'string' }, email: { type: 'string' }, json: { type: 'boolean', default: false } },
  });
  if (!values.org) throw cli.usage('user create needs --org ORG_ID');
  if (!values.email) throw cli.usage('user create needs --email EMAIL');
  const password = await readStdin();
  if (!password) throw cli.usage('user create reads the password from stdin, and it was empty');
  const user = await cli.withOrm(config, (orm) => createUser(orm.em.fork(), { organizationId: values.org!, email: values.email!, password }));
  const shown = { id: user.id, organizationId: user.organizationId, email: user.email, createdAt: user.createdAt.toISOString() };
  cli.print(values.json ? JSON.stringify(shown) : `Created user ${user.id} (${user.email}) in ${user.organizationId}.`);
}

/** `user list --org ID [--json]` */
export async function userList(cli: OperatorCli, config: Config, args: string[]): Promise<void> {
  const { values } = parseArgs({ args, options: { org: { type: 'string' }, json: { type: 'boolean', default: false } } });
  if (!values.org) throw cli.usage('user list needs --org ORG_ID');
  const users = (await cli.withOrm(config, (orm) => listUsers(orm.em.fork(), values.org!))).map((u) => ({
    id: u.id,
    organizationId: u.organizationId,
    email: u.email,
    createdAt: u.createdAt.toISOString(),
  }));
  if (values.json) cli.print(JSON.stringify(users));
  else cli.print(users.length ? users.map((u) => `${u.id}  ${u.email}  ${u.createdAt}`).join('\n') : 'No users.');
}

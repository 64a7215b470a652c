import pg from 'pg';

/** The server of DATABASE_URL (or the default), with another database name. */
export function databaseUrl(name: string): string {
  const url = new URL(process.env.DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/mailroom');
  url.pathname = `/${name}`;
  return url.toString();
}

export async function adminQuery(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl('postgres') });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

export async function dropDatabase(name: string): Promise<void> {
  await adminQuery(`drop database if exists "${name}" with (force)`);
}

/** Name of the migrated template this run's test databases are copied from. */
export function templateName(): string {
  const name = process.env.MAILROOM_TEST_TEMPLATE;
  if (!name) throw new Error('MAILROOM_TEST_TEMPLATE is not set: run the tests through vitest (global setup)');
  return name;
}

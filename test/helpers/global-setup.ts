import { execFileSync } from 'node:child_process';
import { initOrm, migrate } from '../../src/shared/db/orm.js';
import { adminQuery, databaseUrl, dropDatabase } from './database.js';

// One migrated template per run; every test file copies it into a database of its own
// (CREATE DATABASE ... TEMPLATE), which takes a fraction of a second.
export default async function setup(): Promise<() => Promise<void>> {
  // Tests that run `npm start` or `npm run cli` run the compiled dist/, as users do: build
  // it once here (a no-op when it is fresh) rather than inside one test's timeout.
  execFileSync(process.execPath, ['scripts/ensure-build.mjs'], { stdio: ['ignore', 'inherit', 'inherit'] });
  const template = `mailroom_test_tpl_${process.pid}`;
  await dropDatabase(template);
  await adminQuery(`create database "${template}"`);
  const orm = await initOrm({ databaseUrl: databaseUrl(template), poolSize: 1 });
  try {
    await migrate(orm);
  } finally {
    await orm.close(true);
  }
  process.env.MAILROOM_TEST_TEMPLATE = template;
  return async () => {
    await dropDatabase(template);
  };
}

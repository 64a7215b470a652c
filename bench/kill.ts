import type { ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { buildApp } from '../src/api/app.js';
import { UNCERTAIN_REASON } from '../src/shared/emails/deliver.js';
import { createSenderRow, seedSubscribers } from '../test/helpers/campaigns.js';
import { startCountingSink } from '../test/helpers/counting-sink.js';
import { createBenchEnv, fmt, spawnService } from './harness.js';

// `npm run bench:kill`: the fault run of docs/operations.md ("Killing a process"). For a
// relay answering in 2 ms, then in 20 ms: a 2,000-email batch (20 calls of 100) and a
// 3,000-subscriber campaign are accepted, a worker process (its own process group) sends
// them over its 16-connection pool and is SIGKILLed at a random moment, KILLS times, each
// time restarted RESTART_MS later. Then: duplicates at the relay, emails lost (not sent and
// not uncertain), emails the relay has that read anything but sent, uncertain ones per kill
// (the dead worker's `dot:` keys) against the connections in flight, rows left `sending`,
// and the campaign's counter.
const KILLS = Number(process.env.BENCH_KILLS ?? 10);
const BATCH = Number(process.env.BENCH_BATCH ?? 2_000);
const AUDIENCE = Number(process.env.BENCH_AUDIENCE ?? 3_000);
const RESTART_MS = Number(process.env.BENCH_RESTART_MS ?? 5_000);
const DELAYS = (process.env.BENCH_DELAYS ?? '2,20').split(',').map(Number);

const bench = await createBenchEnv('kill', {});
const app = await buildApp(bench.services);
await app.ready();
const em = bench.services.orm.em.fork();
const sql = <T>(query: string, params: unknown[] = []) => em.fork().execute(query, params, 'all') as Promise<T[]>;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const children = new Set<ChildProcess>();

async function startWorker(smtpUrl: string): Promise<ChildProcess> {
  const child = await spawnService('src/workers/main.ts', { ...bench.env, MAIL_TRANSPORT: 'smtp', SMTP_URL: smtpUrl, LOG_LEVEL: 'error' }, undefined, { detached: true, quiet: true });
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}
const killGroup = (child: ChildProcess) => {
  try {
    process.kill(-child.pid!, 'SIGKILL');
  } catch {
    // gone
  }
};
const exited = (child: ChildProcess) => new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve(undefined) : child.once('exit', resolve)));

async function fenceValues(): Promise<string[]> {
  const redis = bench.services.redis;
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${bench.config.redisPrefix}:handover:*`, 'COUNT', 1000);
    cursor = next;
    keys.push(...found);
  } while (cursor !== '0');
  return keys.length ? ((await redis.mget(keys)).filter(Boolean) as string[]) : [];
}

const results: string[] = [];
try {
  let subscriberStart = 0;
  for (const replyDelayMs of DELAYS) {
    const sink = await startCountingSink({ replyDelayMs });
    const { createOrganization } = await import('../src/shared/organizations/service.js');
    const org = await createOrganization(em.fork(), bench.services.box, { name: `Kill ${replyDelayMs}`, verifyQuota: 1000 });
    const organizationId = org.organization.id;
    const auth = { authorization: `Bearer ${org.token.token}` };
    const domain = `kill${replyDelayMs}.test`;
    const senderId = await createSenderRow(bench.services, organizationId, `news@${domain}`, 'Acme', `unsigned.${domain}`);
    await seedSubscribers(bench.services, organizationId, AUDIENCE, { domain: 'example.net', start: subscriberStart });
    subscriberStart += AUDIENCE;
    for (let b = 0; b < BATCH / 100; b++) {
      const res = await app.inject({
        method: 'POST',
        url: '/api/v2/emails/batch',
        headers: auth,
        payload: Array.from({ length: 100 }, (_, i) => ({ from: `Acme <receipts@${domain}>`, to: `user${b * 100 + i}@example.com`, subject: 'Receipt', html: `<p>Receipt ${i}</p>` })),
      });
      if (res.statusCode !== 200) throw new Error(res.body);
    }
    const created = await app.inject({ method: 'POST', url: '/api/v2/campaigns', headers: auth, payload: { name: 'Kill', subject: 'Hi {{name}}', senderId, content: 'Hello {{email}}\n\n[Unsubscribe]({{unsubscribe_url}})' } });
    const campaignId = created.json().id as string;
    await app.inject({ method: 'POST', url: `/api/v2/campaigns/${campaignId}/send`, headers: auth, payload: {} });
    const total = BATCH + AUDIENCE;

    const perKill: { atSink: number; sending: number; uncertain: number; acceptedUnrecorded: number }[] = [];
    let worker = await startWorker(sink.url);
    for (let k = 0; k < KILLS; k++) {
      // A random moment once this worker is handing mail over.
      const from = sink.accepted;
      const target = from + 20 + Math.floor(Math.random() * Math.max(50, (total - from) / (KILLS - k + 1)));
      for (const t = Date.now(); sink.accepted < target && Date.now() - t < 60_000; ) await sleep(1);
      await sleep(Math.random() * 20);
      killGroup(worker);
      await exited(worker);
      const pid = worker.pid!;
      await sleep(50);
      const values = await fenceValues();
      const [row] = await sql<{ n: number }>(`select count(*)::int as n from emails where organization_id = ? and status = 'sending'`, [organizationId]);
      perKill.push({ atSink: sink.accepted, sending: row!.n, uncertain: values.filter((v) => v.startsWith(`dot:${pid}-`)).length, acceptedUnrecorded: values.filter((v) => v.startsWith('accepted:')).length });
      await sleep(RESTART_MS);
      worker = await startWorker(sink.url);
    }
    const restarted = Date.now();
    let settledMs: number | undefined;
    for (;;) {
      const [row] = await sql<{ pending: number; sending: number; n: number }>(
        `select count(*) filter (where status in ('queued', 'sending'))::int as pending, count(*) filter (where status = 'sending')::int as sending, count(*)::int as n from emails where organization_id = ?`,
        [organizationId],
      );
      if (row!.pending === 0 && row!.n === total) {
        settledMs = Date.now() - restarted;
        break;
      }
      if (Date.now() - restarted > 120_000) break;
      await sleep(200);
    }
    await sleep(500);
    killGroup(worker);
    await exited(worker);

    const rows = await sql<{ id: string; status: string; failure_reason: string | null }>(`select id, status, failure_reason from emails where organization_id = ?`, [organizationId]);
    const received = (id: string) => sink.received.get(`${id}@${domain}`) ?? 0;
    const duplicates = [...sink.received.values()].filter((n) => n > 1).length;
    const uncertain = rows.filter((r) => r.failure_reason === UNCERTAIN_REASON);
    const lost = rows.filter((r) => r.status !== 'sent' && r.failure_reason !== UNCERTAIN_REASON).length;
    const acceptedNotSent = rows.filter((r) => received(r.id) > 0 && r.status !== 'sent' && r.failure_reason !== UNCERTAIN_REASON).length;
    const [campaign] = await sql<{ counted: number; sent: number }>(
      `select c.emails_sent_count as counted, (select count(*)::int from emails e where e.campaign_id = c.id and e.status = 'sent') as sent from campaigns c where c.id = ?`,
      [campaignId],
    );
    console.log(`relay answering in ${replyDelayMs} ms, ${total} emails, ${KILLS} kills:`);
    console.table(perKill);
    const line = `| ${replyDelayMs} ms | ${KILLS} | ${duplicates} | ${lost} | ${acceptedNotSent} | ${uncertain.length} (${perKill.map((k) => k.uncertain).join(', ')}; ${uncertain.filter((r) => received(r.id) > 0).length} at the relay) | ${Math.max(...perKill.map((k) => k.sending))} | ${settledMs === undefined ? 'not settled in 120 s' : `${fmt(settledMs / 1000, 1)} s`} | ${campaign!.counted} / ${campaign!.sent} |`;
    console.log(line);
    results.push(line);
    await sink.close();
  }
  const [load] = await readFile('/proc/loadavg', 'utf8').then((s) => s.split(' '));
  console.log('');
  console.log('| relay answer | kills | duplicates | lost | accepted, not sent | uncertain (per kill; at the relay) | max `sending` at a kill | all settled after the last restart | campaign counter / sent |');
  console.log('|---|---|---|---|---|---|---|---|---|');
  for (const line of results) console.log(line);
  console.log(`load average: ${load} (2 cores)`);
} finally {
  for (const c of children) killGroup(c);
  await app.close();
  await bench.dispose();
}

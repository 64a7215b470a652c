import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bearer, createOrg, createTestContext, type TestContext } from './helpers/context.js';
import { startCountingSink, type CountingSink } from './helpers/counting-sink.js';
import { closedPort, runService, type ServiceProcess } from './helpers/process.js';

// Issue 9: two API processes and two worker processes on one PostgreSQL and one Redis take
// 2,000 sends; a worker is SIGKILLed halfway and replaced; every email reaches the SMTP
// server exactly once and reads `sent`.
const TOTAL = 2_000;
const BATCHES = 6; // of 100, the rest one by one
const CLIENT_CONCURRENCY = 16;

let sink: CountingSink;
let ctx: TestContext;
let token: string;
const processes: ServiceProcess[] = [];

function start(entry: string, env: Record<string, string>): ServiceProcess {
  const proc = runService(entry, [], { ...ctx.env.env, ...env });
  processes.push(proc);
  return proc;
}

async function startApi(): Promise<string> {
  const port = await closedPort();
  const api = start('src/api/server.ts', { PORT: String(port) });
  const base = `http://127.0.0.1:${port}`;
  for (const started = Date.now(); ; ) {
    const ok = await fetch(`${base}/readyz`).then((r) => r.ok, () => false);
    if (ok) return base;
    if (api.child.exitCode !== null) throw new Error(`API exited:\n${api.stderr()}`);
    if (Date.now() - started > 45_000) throw new Error(`API did not start:\n${api.stdout()}\n${api.stderr()}`);
    await sleep(50);
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function post(base: string, path: string, body: unknown): Promise<unknown> {
  const res = await fetch(`${base}${path}`, { method: 'POST', headers: { ...bearer(token), 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`${path}: ${res.status} ${await res.text()}`);
  return res.json();
}

const message = (i: number) => ({ from: 'Acme <receipts@acme.test>', to: `user${i}@example.com`, subject: `Receipt ${i}`, html: `<p>Receipt <b>${i}</b></p>` });

async function pool<T>(items: T[], concurrency: number, run: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < items.length) await run(items[next++]!);
  }));
}

/** Fence keys (`{prefix}:handover:{id}`) and their values. */
async function fenceMarkers(): Promise<string[]> {
  const redis = ctx.services.redis;
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `${ctx.env.config.redisPrefix}:handover:*`, 'COUNT', 1000);
    cursor = next;
    keys.push(...found);
  } while (cursor !== '0');
  return keys.length ? ((await redis.mget(keys)).filter(Boolean) as string[]) : [];
}

beforeAll(async () => {
  sink = await startCountingSink();
  ctx = await createTestContext({ MAIL_TRANSPORT: 'smtp', SMTP_URL: sink.url, LOG_LEVEL: 'warn' });
  ({ token } = await createOrg(ctx.services));
});

afterAll(async () => {
  for (const p of processes) p.kill();
  await Promise.all(processes.map((p) => p.exited));
  await ctx?.close();
  await sink?.close();
});

describe('scale-out: 2 APIs, 2 workers, one killed', () => {
  it('delivers 2,000 emails exactly once and every one reads sent', { timeout: 150_000 }, async () => {
    const started = Date.now();
    const [apiA, apiB] = await Promise.all([startApi(), startApi()]);

    // Sends: batches of 100 and single sends, alternating between the two APIs.
    const ids: string[] = [];
    const singles = Array.from({ length: TOTAL - BATCHES * 100 }, (_, i) => i);
    const batches = Array.from({ length: BATCHES }, (_, b) => b);
    const sending = Promise.all([
      pool(batches, 2, async (b) => {
        const res = (await post(b % 2 ? apiB : apiA, '/api/v2/emails/batch', Array.from({ length: 100 }, (_, i) => message(100_000 + b * 100 + i)))) as { data: { id: string }[] };
        ids.push(...res.data.map((d) => d.id));
      }),
      pool(singles, CLIENT_CONCURRENCY, async (i) => {
        const res = (await post(i % 2 ? apiB : apiA, '/api/v2/emails', message(i))) as { id: string };
        ids.push(res.id);
      }),
    ]);

    // The workers start once a backlog has built up, so that they are busy when one is
    // killed (the APIs accept faster than two workers send on 2 cores, but not by much).
    while (ids.length < 800) await sleep(10);
    // info: the workers log each email they take over from a dead one.
    const workerA = start('src/workers/main.ts', { LOG_LEVEL: 'info' });
    const workerB = start('src/workers/main.ts', { LOG_LEVEL: 'info' });

    // Halfway: SIGKILL worker A. It is first frozen (SIGSTOP) at an instant when none of its
    // emails is inside the one window nothing can resolve (final `.` sent, answer not yet
    // recorded; docs/operations.md): everything else it holds (claimed but not handed over,
    // accepted but not recorded) must be recovered by the others.
    while (sink.accepted < TOTAL / 2) await sleep(10);
    const pid = workerA.child.pid!;
    const sinkAtKill = sink.accepted;
    let markers: string[];
    let tries = 0;
    for (; ; tries++) {
      process.kill(pid, 'SIGSTOP');
      await sleep(30); // its Redis commands already sent are applied
      markers = await fenceMarkers();
      if (!markers.some((m) => m.startsWith(`dot:${pid}-`)) || tries > 200) break;
      process.kill(pid, 'SIGCONT');
      await sleep(3 + Math.random() * 10);
    }
    workerA.child.kill('SIGKILL');
    await workerA.exited;
    const atKill = {
      freezes: tries + 1,
      sinkCount: sinkAtKill,
      acceptedUnrecorded: markers.filter((m) => m.startsWith('accepted:')).length,
      sendingRows: Number(
        (await ctx.services.orm.em.fork().execute<{ n: string }[]>(`select count(*) as n from emails where status = 'sending'`))[0]!.n,
      ),
    };
    const workerC = start('src/workers/main.ts', { LOG_LEVEL: 'info' });
    await sending;
    expect(ids).toHaveLength(TOTAL);
    expect(new Set(ids).size).toBe(TOTAL);

    // Everything arrives: the dead worker's jobs come back after their lock (10 s) expires.
    const em = ctx.services.orm.em.fork();
    for (;;) {
      const [row] = await em.execute<{ sent: string; other: string }[]>(
        `select count(*) filter (where status = 'sent') as sent, count(*) filter (where status <> 'sent') as other from emails`,
      );
      if (Number(row!.sent) >= TOTAL) break;
      if (Date.now() - started > 125_000) throw new Error(`not all sent: ${JSON.stringify(row)}, sink ${sink.accepted}`);
      await sleep(100);
    }
    await sleep(300); // anything sent twice would arrive by now

    // Exactly once at the SMTP server, by Message-ID ({email id}@acme.test).
    const duplicates = [...sink.received].filter(([, n]) => n > 1);
    expect(duplicates).toEqual([]);
    const missing = ids.filter((id) => sink.received.get(`${id}@acme.test`) !== 1);
    expect(missing).toEqual([]);
    expect(sink.accepted).toBe(TOTAL);

    // And through the API (both processes), every one reads sent.
    const events = new Map<string, number>();
    await pool(ids, 16, async (id) => {
      const res = await fetch(`${events.size % 2 ? apiB : apiA}/api/v2/emails/${id}`, { headers: bearer(token) });
      const event = ((await res.json()) as { last_event: string }).last_event;
      events.set(event, (events.get(event) ?? 0) + 1);
    });
    expect(Object.fromEntries(events)).toEqual({ sent: TOTAL });

    // When the kill interrupted hand-overs (nearly always: it lands mid-run), the survivors
    // took them over. On a quiet machine the killed worker may hold nothing at that instant;
    // the exactly-once checks above hold either way.
    if (atKill.sendingRows > 0) {
      const logs = workerB.stdout() + workerC.stdout();
      expect(logs).toMatch(/took over an email a dead worker had claimed but not handed over/);
    }

    console.log(`scale-out: ${TOTAL} emails in ${((Date.now() - started) / 1000).toFixed(1)} s; at the kill: ${JSON.stringify(atKill)}`);
  });
});

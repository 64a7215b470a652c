import { runFanOut } from '../src/shared/campaigns/fanout.js';
import { createSenderRow, seedSubscribers } from '../test/helpers/campaigns.js';
import { createBenchEnv, fmt } from './harness.js';

// `npx tsx bench/campaign-fanout-memory.ts` (BENCH_SUBSCRIBERS, default 100,000): the fan-out
// alone, in this process, printing memory about ten times: does RSS grow with the audience?
const TOTAL = Number(process.env.BENCH_SUBSCRIBERS ?? 100_000);
const bench = await createBenchEnv('campaignmem', {});
try {
  const senderId = await createSenderRow(bench.services, bench.organizationId, 'news@acme.test');
  for (let done = 0; done < TOTAL; done += 50_000) await seedSubscribers(bench.services, bench.organizationId, Math.min(50_000, TOTAL - done), { domain: 'example.com', start: done });
  const em = bench.services.orm.em.fork();
  const id = 'cmp_01jzzzzzzzzzzzzzzzzzzzzzzz';
  await em.execute(
    `insert into campaigns (id, organization_id, name, subject, status, content_type, content, sender_id, created_at, updated_at)
     values (?, ?, 'm', 'News {{name}}', 'SCHEDULED', 'MARKDOWN', ?::jsonb, ?, now(), now())`,
    [id, bench.organizationId, JSON.stringify('# News\n\nHello **{{name}}**\n\n[Unsubscribe]({{unsubscribe_url}})'), senderId],
  );
  let peak = 0;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
  const started = Date.now();
  let pages = 0;
  let queued = 0;
  // About ten memory lines whatever the audience.
  const every = Math.max(1, Math.round(TOTAL / 10 / bench.config.campaignFanoutPage));
  const result = await runFanOut(bench.services.orm.em.fork(), {
    producer: bench.services.producer,
    logger: bench.services.logger,
    pageSize: bench.config.campaignFanoutPage,
    policy: bench.config,
    now: () => new Date(),
    metrics: { campaignRecipientsQueued: { inc: (n: number) => { queued += n; if (++pages % every === 0) { const m = process.memoryUsage(); console.log(`${fmt(queued)} at ${fmt((Date.now() - started) / 1000, 1)} s: rss ${fmt(m.rss / 2 ** 20)} heap ${fmt(m.heapUsed / 2 ** 20)} ext ${fmt(m.external / 2 ** 20)} ab ${fmt(m.arrayBuffers / 2 ** 20)}`); } } }, campaignsFinished: { inc: () => {} }, emailsAccepted: { inc: () => {} } } as never,
  }, id);
  clearInterval(timer);
  console.log(`result ${result}`);
  console.log(`fan-out of ${fmt(TOTAL)} in ${fmt((Date.now() - started) / 1000, 2)} s; peak RSS ${fmt(peak / 2 ** 20)} MiB`);
} finally {
  await bench.dispose();
}

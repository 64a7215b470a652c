const mods = process.argv.slice(2);
const mb = (n: number) => (n / 1048576).toFixed(1);
(globalThis as any).gc?.();
const r0 = process.memoryUsage();
for (const m of mods) await import(m);
(globalThis as any).gc?.();
const r1 = process.memoryUsage();
console.log(mods.join(' ').slice(-80), 'rss', mb(r0.rss), '->', mb(r1.rss), 'heapUsed', mb(r0.heapUsed), '->', mb(r1.heapUsed));

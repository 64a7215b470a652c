import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

// The customer's application for bench:webhooks, in a process of its own: every path answers
// 200 at once, except `/slow`, which answers after 10 s. Reports its URL, then answers
// "count" with the requests received per path.
const counts: Record<string, number> = {};
const server = createServer((request, response) => {
  request.resume();
  request.on('end', () => {
    const path = request.url ?? '/';
    counts[path] = (counts[path] ?? 0) + 1;
    if (path === '/slow') setTimeout(() => response.end('ok'), 10_000);
    else response.end('ok');
  });
});
server.keepAliveTimeout = 30_000;
server.listen(0, '127.0.0.1', () => process.send?.({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }));
process.on('message', (message) => {
  if (message === 'count') process.send?.({ counts });
  if (message === 'stop') {
    server.closeAllConnections();
    server.close(() => process.exit(0));
  }
});

import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ReceivedWebhook {
  path: string;
  headers: IncomingHttpHeaders;
  body: string;
  at: number;
}

/**
 * A customer's application on loopback (port 0). Paths choose the behaviour:
 * `/ok` 200 at once; `/fail-twice` 500 for the first two attempts of each webhook-id;
 * `/status/NNN` that status; `/hang` never answers; `/reset` drops the connection;
 * `/huge` answers 200 with an endless body; `/redirect` 302 to `/ok`;
 * `/slow/MS` answers 200 after MS milliseconds.
 */
export interface WebhookReceiver {
  url: string;
  received: ReceivedWebhook[];
  /** Requests to one path. */
  at(path: string): ReceivedWebhook[];
  close(): Promise<void>;
}

export async function startWebhookReceiver(): Promise<WebhookReceiver> {
  const received: ReceivedWebhook[] = [];
  const attemptsById = new Map<string, number>();
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const path = request.url ?? '/';
      received.push({ path, headers: request.headers, body: Buffer.concat(chunks).toString('utf8'), at: Date.now() });
      const id = String(request.headers['webhook-id']);
      const attempt = (attemptsById.get(`${path} ${id}`) ?? 0) + 1;
      attemptsById.set(`${path} ${id}`, attempt);
      if (path === '/ok') return void response.end('ok');
      if (path === '/fail-twice') {
        response.statusCode = attempt <= 2 ? 500 : 200;
        return void response.end();
      }
      const status = /^\/status\/(\d{3})$/.exec(path);
      if (status) {
        response.statusCode = Number(status[1]);
        return void response.end();
      }
      if (path === '/hang') return;
      if (path === '/reset') return void request.socket.destroy();
      if (path === '/redirect') {
        response.writeHead(302, { location: '/ok' });
        return void response.end();
      }
      if (path === '/huge') {
        // An endless answer: only what the client reads is ever produced.
        response.writeHead(200, { 'content-type': 'application/octet-stream' });
        const chunk = Buffer.alloc(64 * 1024, 120);
        const pump = () => {
          while (response.write(chunk)) {
            /* until the client stops reading */
          }
        };
        response.on('drain', pump);
        response.on('error', () => {});
        return pump();
      }
      const slow = /^\/slow\/(\d+)$/.exec(path);
      if (slow) return void setTimeout(() => response.end('ok'), Number(slow[1]));
      response.statusCode = 404;
      response.end();
    });
  });
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    received,
    at: (path) => received.filter((r) => r.path === path),
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

import { createHmac } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { safeEqual } from '../../shared/crypto.js';
import { AppError, NotFoundError } from '../../shared/errors.js';
import { lastEvent } from '../../shared/emails/last-event.js';
import { Email } from '../../shared/db/entities/index.js';
import { applyProviderEvent, ProviderEventBody } from '../../shared/outcomes/provider-events.js';
import { readClickToken, readOpenToken } from '../../shared/outcomes/tokens.js';
import { lazyChildLogger } from '../plugins/lazy-logger.js';
import type { App } from '../types.js';

// A transparent 1x1 GIF, and the headers of every answer (set once per answer, no parsing).
const PIXEL = Buffer.from('R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7', 'base64');
const NO_STORE = 'no-store, no-cache, must-revalidate, private';
const PIXEL_HEADERS = { 'content-type': 'image/gif', 'cache-control': NO_STORE, 'content-length': String(PIXEL.length) };

// Wildcard routes: a click token carries its URL and may exceed the router's 100-character
// limit on a named parameter.
const TokenParams = z.object({ '*': z.string().max(8_000) });

function userAgent(request: FastifyRequest): string | null {
  const ua = request.headers['user-agent'];
  return typeof ua === 'string' ? ua.slice(0, 1_000) : null;
}

/**
 * docs/outcomes.md "Tokens": `GET /t/o/{token}.gif` (open pixel) and `GET /t/c/{token}` (click
 * redirect), public. They answer at once; the hit is written by the TrackingRecorder within a few
 * milliseconds, batched with the others (flushed when the app closes). HEAD answers the same way
 * without counting (link scanners).
 */
export async function trackingRoutes(app: App): Promise<void> {
  const { signer, clock } = app.services;
  // The process's (services.trackingRecorder): its buffered hits are written when the app closes.
  const recorder = app.services.trackingRecorder;
  app.addHook('onClose', async () => recorder.close());

  // The token is checked against its HMAC before anything is read (a NUL never passes):
  // the hottest public routes skip the NUL check of errors.ts. No request logger unless one
  // is used (these routes log only when they fail).
  const pixel = {
    exposeHeadRoute: false,
    childLoggerFactory: lazyChildLogger,
    schema: { hide: true, params: TokenParams },
    config: { acceptsNul: true },
  } as const;
  const openOf = (token: string) => {
    const read = token.endsWith('.gif') ? readOpenToken(signer, token.slice(0, -4)) : null;
    if (!read) throw new NotFoundError('This tracking link is not valid');
    return read;
  };
  app.get('/t/o/*', pixel, async (request, reply) => {
    const { emailId } = openOf(request.params['*']);
    recorder.record({ emailId, type: 'open', at: clock(), ip: request.ip ?? null, userAgent: userAgent(request), url: null });
    return reply.headers(PIXEL_HEADERS).send(PIXEL);
  });
  app.head('/t/o/*', pixel, async (request, reply) => {
    openOf(request.params['*']);
    return reply.headers(PIXEL_HEADERS).send();
  });

  const click = {
    exposeHeadRoute: false,
    childLoggerFactory: lazyChildLogger,
    schema: { hide: true, params: TokenParams },
    config: { acceptsNul: true },
  } as const;
  const clickOf = (token: string) => {
    const read = readClickToken(signer, token);
    if (!read) throw new NotFoundError('This tracking link is not valid');
    return { ...read, location: asciiLocation(read.url) };
  };
  app.get('/t/c/*', click, async (request, reply) => {
    const { emailId, url, location } = clickOf(request.params['*']);
    recorder.record({ emailId, type: 'click', at: clock(), ip: request.ip ?? null, userAgent: userAgent(request), url });
    return reply.header('cache-control', NO_STORE).redirect(location, 302);
  });
  app.head('/t/c/*', click, async (request, reply) => {
    const { location } = clickOf(request.params['*']);
    return reply.header('cache-control', NO_STORE).redirect(location, 302);
  });
}

/**
 * A link as a Location header can carry it: a header is ASCII, so a host in Unicode becomes its
 * punycode and other non-ASCII characters are percent-encoded, as a browser does with the link
 * itself (the URL parser's `href`). A link the parser refuses (a token made before links were
 * checked for it) keeps its ASCII characters and has the others percent-encoded.
 */
function asciiLocation(url: string): string {
  if (URL.canParse(url)) return new URL(url).href;
  return url.replace(/[^\x00-\x7f]+/gu, (characters) => encodeURIComponent(characters));
}

const SIGNATURE = /^sha256=([0-9a-f]{64})$/i;
// Replay window of a timestamped event (docs/security.md).
const WEBHOOK_MAX_AGE_S = 600;

/**
 * docs/outcomes.md "Provider webhook": `POST /webhooks/provider`, authenticated by
 * `X-Mailroom-Signature: sha256=HEX`, the HMAC-SHA256 of the raw body under PROVIDER_WEBHOOK_SECRET
 * (compared in constant time). The signature is checked before the body is read: 401, then 400
 * (not JSON) or 422 (not an event).
 *
 * Optional `X-Mailroom-Timestamp: <Unix seconds>`: the signature is then over
 * `<timestamp>.<raw body>`, and an event more than 10 minutes from now is refused (401),
 * so a captured request cannot be replayed later. Without the header the format is
 * unchanged (signature over the body alone).
 */
export async function providerWebhookRoutes(app: App): Promise<void> {
  // This plugin's own JSON parser keeps the exact bytes that were signed. A body that is not
  // JSON goes on as undefined (JSON never parses to it), as the providers' routes do, so that
  // the signature is checked first: 401 for an unsigned one, 400 `invalid_json` (docs/foundation.md "Errors")
  // for a signed one.
  const raw = new WeakMap<FastifyRequest, Buffer>();
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body: Buffer, done) => {
    raw.set(request, body);
    try {
      done(null, JSON.parse(body.toString('utf8')));
    } catch {
      done(null, undefined);
    }
  });

  app.post(
    '/webhooks/provider',
    {
      schema: {
        hide: true,
        body: ProviderEventBody,
        response: { 200: z.object({ id: z.string(), last_event: z.string(), changed: z.boolean() }) },
      },
      preValidation: async (request) => {
        const secret = app.services.config.providerWebhookSecret;
        const header = request.headers['x-mailroom-signature'];
        const match = typeof header === 'string' ? SIGNATURE.exec(header.trim()) : null;
        const body = raw.get(request) ?? Buffer.alloc(0);
        const stamp = request.headers['x-mailroom-timestamp'];
        if (stamp !== undefined && (typeof stamp !== 'string' || !/^\d{1,12}$/.test(stamp.trim()))) {
          throw new AppError(401, 'invalid_signature', 'X-Mailroom-Timestamp must be Unix seconds');
        }
        const hmac = secret ? createHmac('sha256', secret) : undefined;
        if (hmac && stamp !== undefined) hmac.update(`${stamp.trim()}.`);
        const expected = hmac?.update(body).digest('hex');
        if (!expected || !match || !safeEqual(match[1]!.toLowerCase(), expected)) {
          throw new AppError(401, 'invalid_signature', 'Missing or invalid X-Mailroom-Signature');
        }
        if (stamp !== undefined && Math.abs(app.services.clock().getTime() / 1000 - Number(stamp.trim())) > WEBHOOK_MAX_AGE_S) {
          throw new AppError(401, 'invalid_signature', "X-Mailroom-Timestamp is more than 10 minutes away from this server's clock: refused as a possible replay (or a clock that is off)");
        }
        if (request.body === undefined) throw new AppError(400, 'invalid_json', 'The body is not valid JSON');
      },
    },
    async (request) => {
      const result = await applyProviderEvent(request.em, request.body, { metrics: app.services.metrics, now: app.services.clock() });
      const email = await request.em.fork().findOneOrFail(Email, result.emailId);
      return { id: email.id, last_event: lastEvent(email), changed: result.changed };
    },
  );
}

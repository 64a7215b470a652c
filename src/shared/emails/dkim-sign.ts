import { createPrivateKey, sign as rsaSign, type KeyObject } from 'node:crypto';
import { createRequire } from 'node:module';
import { LRUCache } from 'lru-cache';

/**
 * DKIM signing of a built message with nodemailer's own canonicalization (the same bytes as
 * `new DKIM(key).sign(raw)`, test/dkim-sign.test.ts compares them), but with the RSA signature
 * computed in libuv's thread pool (`crypto.sign` with a callback) instead of on the event loop.
 *
 * Why not nodemailer's signer as it is: it runs the message through three Transform streams
 * (a setImmediate a chunk) and signs synchronously; on a 4.5 KB campaign message it cost 600 us
 * of CPU, 250 of them the RSA signature, the rest the streams. Here the header split, the
 * header parse and the relaxed body hash run once over the whole buffer (nodemailer's
 * `MessageParser#parseHeaders`, `RelaxedBody`'s transform and `relaxedHeaders`, called
 * directly), and only the signature, a few hundred bytes of input, leaves the event loop: no
 * worker thread, so no second heap and no message sent to one and back.
 */
const require = createRequire(import.meta.url);

interface Header {
  key: string;
  line: string;
}
const MessageParser = require('nodemailer/lib/dkim/message-parser.js') as { prototype: { parseHeaders(this: { rawHeaders: Buffer }): Header[] } };
const RelaxedBody = require('nodemailer/lib/dkim/relaxed-body.js') as new (options: { hashAlgo: string }) => RelaxedBodyStream;
interface RelaxedBodyStream {
  on(event: 'hash', listener: (hash: string) => void): void;
  _transform(chunk: Buffer, encoding: string, callback: () => void): void;
  _flush(callback: () => void): void;
}
const { relaxedHeaders } = require('nodemailer/lib/dkim/sign.js') as {
  relaxedHeaders(headers: Header[], fieldNames: string, skipFields?: string): { headers: string; fieldNames: string };
};
const { foldLines } = require('nodemailer/lib/mime-funcs/index.js') as { foldLines(text: string, lineLength: number): string };
const punycode = require('nodemailer/lib/punycode/index.js') as { toASCII(domain: string): string };

const HASH = 'sha256';
// Every field RFC 6376 section 5.4.1 lists: what nodemailer signs when the key's options name
// no `headerFieldNames` (the domains module names its own, docs/domains.md).
const FIELD_NAMES =
  'From:Sender:Reply-To:Subject:Date:Message-ID:To:Cc:MIME-Version:Content-Type:Content-Transfer-Encoding:Content-ID:' +
  'Content-Description:Resent-Date:Resent-From:Resent-Sender:Resent-To:Resent-Cc:Resent-Message-ID:In-Reply-To:References:' +
  'List-Id:List-Help:List-Unsubscribe:List-Subscribe:List-Post:List-Owner:List-Archive';
const CRLF = Buffer.from('\r\n');
const noop = () => {};

/** Parsed private keys by PEM: parsing a PEM for every message costs twice the signature itself. */
const MAX_PARSED_KEYS = 256;
// A memo of a pure transform (the same PEM gives the same key whatever the app or config).
// `false`: a PEM that cannot be read, remembered too (not parsed again for every message).
const parsedKeys = new LRUCache<string, KeyObject | false>({ max: MAX_PARSED_KEYS });

function keyObject(privateKey: DkimKey['privateKey']): KeyObject | undefined {
  if (typeof privateKey !== 'string') return privateKey;
  let key = parsedKeys.get(privateKey);
  if (key === undefined) {
    try {
      key = createPrivateKey(privateKey);
    } catch {
      key = false;
    }
    parsedKeys.set(privateKey, key);
  }
  return key || undefined;
}

/**
 * Where the header ends, as nodemailer's MessageParser finds it: after the first LF that
 * follows an LF or a CR LF (a message without a blank line is all header).
 */
function headerEnd(raw: Buffer): number {
  for (let lf = raw.indexOf(0x0a, 1); lf !== -1; lf = raw.indexOf(0x0a, lf + 1)) {
    if (raw[lf - 1] === 0x0a || (raw[lf - 1] === 0x0d && lf > 1 && raw[lf - 2] === 0x0a)) return lf + 1;
  }
  return raw.length;
}

// A body larger than this is canonicalized a slice at a time, yielding to the event loop in
// between (RelaxedBody reads a stream; a slice boundary is any chunk boundary to it): a 10 MB
// submission hashed at once blocked the loop for about 80 ms.
const BODY_SLICE = 1024 * 1024;

async function relaxedBodyHash(body: Buffer): Promise<string> {
  const relaxed = new RelaxedBody({ hashAlgo: HASH });
  let hash = '';
  relaxed.on('hash', (value) => (hash = value));
  for (let at = 0; at < body.length; ) {
    if (at > 0) await new Promise((resolve) => setImmediate(resolve));
    // No slice starts with a line feed: RelaxedBody looks for bare LFs from a chunk's second
    // byte on, so one at a slice's first byte would be hashed as it is, not as CRLF.
    let end = Math.min(at + BODY_SLICE, body.length);
    while (end < body.length && body[end] === 0x0a) end++;
    relaxed._transform(body.subarray(at, end), 'buffer', noop);
    at = end;
  }
  relaxed._flush(noop);
  return hash;
}

function relaxedHeaderLine(line: string): string {
  return line
    .slice(line.indexOf(':') + 1)
    .replace(/\r?\n/g, '')
    .replace(/\s+/g, ' ')
    .trim();
}

function signAsync(data: string, key: KeyObject): Promise<string | undefined> {
  return new Promise((resolve) => {
    try {
      rsaSign(HASH, Buffer.from(data), key, (error, signature) => resolve(error ? undefined : signature.toString('base64')));
    } catch {
      resolve(undefined);
    }
  });
}

/**
 * A signing key as the domains module issues it (`dkimOptionsFor`): RSA, a PEM or a parsed
 * key, `rsa-sha256` (nodemailer's `hashAlgo`, several `keys` and encrypted keys are not used
 * here).
 */
export interface DkimKey {
  domainName: string;
  keySelector: string;
  privateKey: string | KeyObject;
  headerFieldNames?: string;
  skipFields?: string;
}

/**
 * The message with a DKIM-Signature header in front. A key that cannot sign with RSA-SHA256
 * (unreadable, or not RSA) leaves the message unsigned rather than failing the send, as
 * nodemailer does with a key it cannot read; `onUnsigned` is then told why (the transport logs it).
 */
export async function dkimSign(raw: Buffer, options: DkimKey, onUnsigned: (reason: string) => void = noop): Promise<Buffer> {
  const end = headerEnd(raw);
  // nodemailer's parser passes on a body only when it has more than one byte.
  const body = raw.length - end > 1 ? raw.subarray(end) : raw.subarray(raw.length);
  const key = keyObject(options.privateKey);
  const unsigned = body.length > 0 ? raw : Buffer.concat([raw.subarray(0, end), CRLF]);
  if (key === undefined || key.asymmetricKeyType !== 'rsa') {
    onUnsigned(key === undefined ? 'the private key cannot be read' : `the key is ${key.asymmetricKeyType ?? 'not asymmetric'}, not RSA`);
    return unsigned;
  }

  const headers = MessageParser.prototype.parseHeaders.call({ rawHeaders: raw.subarray(0, end) });
  const canonical = relaxedHeaders(headers, options.headerFieldNames || FIELD_NAMES, options.skipFields);
  const bodyHash = await relaxedBodyHash(body);
  const field =
    foldLines(
      'DKIM-Signature: ' +
        [`v=1`, `a=rsa-${HASH}`, 'c=relaxed/relaxed', `d=${punycode.toASCII(options.domainName)}`, 'q=dns/txt', `s=${options.keySelector}`, `bh=${bodyHash}`, `h=${canonical.fieldNames}`].join('; '),
      76,
    ) + ';\r\n b=';
  const signature = await signAsync(`${canonical.headers}dkim-signature:${relaxedHeaderLine(field)}`, key);
  if (signature === undefined) {
    onUnsigned('the RSA signature failed');
    return unsigned;
  }
  const folded = (field + signature.replace(/(^.{73}|.{75}(?!\r?\n|\r))/g, '$&\r\n ').trim()) + '\r\n';
  return Buffer.concat([Buffer.from(folded), unsigned]);
}

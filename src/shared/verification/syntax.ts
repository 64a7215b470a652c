import { domainToASCII } from 'node:url';

/**
 * Syntax of rule 1 of docs/verification.md, as a sending MTA sees an address (RFC 5321 / 5322 dot-atom):
 * - local part 1..64 octets of atext and single dots; a quoted local part ("a b"@x) is
 *   refused: it is legal but almost never real, and many providers cannot send to it;
 * - the local part is ASCII (no SMTPUTF8 mailboxes); the domain may be an IDN, checked and
 *   normalized to its A-label (punycode) form with UTS 46 (node:url domainToASCII);
 * - domain at most 253 octets, labels 1..63 letters, digits and hyphens, not starting or
 *   ending with a hyphen, at least two labels, a top-level label that is not all digits;
 *   address literals ([192.0.2.1]) are refused;
 * - the whole address at most 254 octets (the 256 of an RFC 5321 path less the brackets).
 * The address is lower-cased (docs/audience.md "Writes"): local parts are case-insensitive in practice.
 */
export type ParsedAddress =
  | { ok: true; email: string; local: string; domain: string; unicodeDomain: string }
  | { ok: false; email: string; reason: string; local: string | null; domain: string | null };

const ATEXT = /^[a-z0-9!#$%&'*+/=?^_`{|}~-]+$/;
const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

/** Longer than any valid address (254 octets, 4 bytes a character at most): echoed and stored cut to it. */
const MAX_INPUT = 1024;

const TOO_LONG = 'the address is longer than 254 octets';

export function parseAddress(input: string): ParsedAddress {
  // Refused for its length before it is cut (the cut could hide its @), and without reading it all.
  if (input.length > MAX_INPUT) return { ok: false, email: input.slice(0, MAX_INPUT).trim().toLowerCase(), reason: TOO_LONG, local: null, domain: null };
  const raw = input.trim().toLowerCase();
  const fail = (reason: string, local: string | null = null, domain: string | null = null): ParsedAddress => ({
    ok: false,
    email: raw,
    reason,
    local,
    domain,
  });
  if (raw.length === 0) return fail('the address is empty');
  if (raw.startsWith('"')) return fail('quoted local parts are not accepted');
  if (/[\s\u0000-\u001f\u007f]/.test(raw)) return fail('the address contains spaces or control characters');
  const at = raw.lastIndexOf('@');
  if (at < 0) return fail('the address has no @');
  const local = raw.slice(0, at);
  const rawDomain = raw.slice(at + 1);
  if (local.includes('@')) return fail('the address has more than one @');
  if (local.length === 0) return fail('the local part is empty');
  if (rawDomain.length === 0) return fail('the domain is empty', local);
  if (Buffer.byteLength(local) > 64) return fail('the local part is longer than 64 octets', local, rawDomain);
  if (!/^[\x21-\x7e]+$/.test(local)) return fail('the local part has characters outside ASCII', local, rawDomain);
  if (local.startsWith('.') || local.endsWith('.') || local.includes('..')) {
    return fail('the local part has a leading, trailing or double dot', local, rawDomain);
  }
  if (!local.split('.').every((atom) => ATEXT.test(atom))) {
    return fail('the local part has characters that need quoting', local, rawDomain);
  }
  if (rawDomain.startsWith('[')) return fail('address literals are not accepted', local, rawDomain);
  const domain = rawDomain.endsWith('.') ? rawDomain.slice(0, -1) : rawDomain;
  // '' when the name is not a valid IDN (UTS 46 with the STD3 rules of node's URL parser).
  const ascii = domainToASCII(domain);
  if (!ascii) return fail('the domain is not a valid host name', local, domain);
  if (ascii.length > 253) return fail('the domain is longer than 253 octets', local, ascii);
  const labels = ascii.split('.');
  if (labels.length < 2) return fail('the domain has no top-level domain', local, ascii);
  if (!labels.every((l) => LABEL.test(l))) return fail('the domain has an invalid label', local, ascii);
  if (/^\d+$/.test(labels[labels.length - 1]!)) return fail('the domain is an IP address or has a numeric top-level domain', local, ascii);
  const email = `${local}@${ascii}`;
  if (Buffer.byteLength(email) > 254) return { ...fail(TOO_LONG, local, ascii), email };
  return { ok: true, email, local, domain: ascii, unicodeDomain: domain };
}

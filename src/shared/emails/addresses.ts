import addressparser from 'nodemailer/lib/addressparser/index.js';
import { addressDomain } from '../domains/hostname.js';

// Pragmatic RFC 5321 mailbox: a local part of 1 to 64 characters without spaces, control
// characters, brackets or separators, its dots single and inside it (a dot-string: `a..b@`, `.a@`, `a.@` are no
// mailbox, and the verifier says so too), and a dotted host name of LDH labels (IDN hosts must
// be given in their xn-- form). Atoms exclude the dot: the match stays linear.
const ADDRESS = /^(?=[^@]{1,64}@)[^\s\x00-\x1f\x7f@<>()[\],;:"\\.]+(?:\.[^\s\x00-\x1f\x7f@<>()[\],;:"\\.]+)*@(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$/;

export interface Mailbox {
  name: string;
  address: string;
}

/**
 * The address with its domain in ASCII (IDNA): smtp-server and mailparser hand over
 * `a@münchen.de` for `a@xn--mnchen-3ya.de`, and the API (like SMTP without SMTPUTF8) takes
 * the xn-- form. A domain that is not a host name is left as it is, for isAddress to refuse.
 */
export function asciiAddress(value: string): string {
  const at = value.lastIndexOf('@');
  if (at < 0 || /^[\x00-\x7f]*$/.test(value.slice(at + 1))) return value;
  const domain = addressDomain(value);
  return domain ? `${value.slice(0, at)}@${domain}` : value;
}

export function isAddress(value: string): boolean {
  return ADDRESS.test(value);
}

/** Whether a value holds a control character other than a tab (whitespace a header may hold). */
export function hasControlCharacter(value: string): boolean {
  return /[\x00-\x08\x0a-\x1f\x7f]/.test(value);
}

/** Whether a value would break out of its header line (header injection). */
export function hasLineBreak(value: string): boolean {
  return /[\r\n]/.test(value);
}

/**
 * `addr` or `Name <addr>` (the name may be quoted): exactly one mailbox, no group.
 * Returns undefined when the value is not one well-formed mailbox.
 */
export function parseMailbox(value: string): Mailbox | undefined {
  // addressparser drops control characters: `a\x01b@x` would pass as `ab@x` and be kept as
  // written. A tab is whitespace a header may hold.
  if (hasControlCharacter(value)) return undefined;
  const trimmed = value.trim();
  if (isAddress(trimmed)) return { name: '', address: trimmed };
  const parsed = addressparser(trimmed, { flatten: false });
  if (parsed.length !== 1) return undefined;
  const [one] = parsed;
  if (!one || 'group' in one || !one.address || !isAddress(one.address)) return undefined;
  // "a@b.c d@e.f" parses as one mailbox named "a@b.c": require the <addr> form with a name.
  if (one.name && !/<[^<>]+>\s*$/.test(trimmed)) return undefined;
  return { name: one.name ?? '', address: one.address };
}

/** The domain of a mailbox (`Name <a@example.com>` -> `example.com`), lower-cased. */
export function mailboxDomain(value: string): string {
  const address = parseMailbox(value)?.address ?? value;
  return address.slice(address.lastIndexOf('@') + 1).toLowerCase();
}

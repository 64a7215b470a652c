import { domainToASCII } from 'node:url';

const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/**
 * A sending-domain hostname in lower-case ASCII (IDN to punycode), or null when it is not a
 * registrable-looking name: at least two labels, LDH labels of 1..63 characters, 253 in all,
 * a TLD that is not numeric (so no IP addresses).
 */
export function normalizeHostname(input: string): string | null {
  const trimmed = input.trim().replace(/\.$/, '');
  if (trimmed === '' || /[\s/@:]/.test(trimmed)) return null;
  const ascii = domainToASCII(trimmed);
  if (ascii === '' || ascii.length > 253) return null;
  const labels = ascii.split('.');
  if (labels.length < 2 || !labels.every((l) => LABEL.test(l))) return null;
  if (/^[0-9]+$/.test(labels[labels.length - 1]!)) return null;
  return ascii;
}

/** The domain part of an address, normalized like a hostname, or null. */
export function addressDomain(address: string): string | null {
  const at = address.lastIndexOf('@');
  if (at <= 0) return null;
  return normalizeHostname(address.slice(at + 1));
}

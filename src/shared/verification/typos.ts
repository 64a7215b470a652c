import { isFreeProvider } from './lists.js';

/**
 * Domain typo detection (rule 1 of docs/verification.md, `domain_typo`, -35). The library
 * suggesters we tried (mailcheck and its forks) suggest `me.com` for `acme.com`, so this is a
 * small, conservative matcher: a domain one edit (insert, delete, replace or swap of two
 * neighbours) away from a popular mailbox domain of at least 8 characters, or a popular provider
 * name with a mistyped `.com`. It never suggests for a domain that is itself on a list.
 */
const POPULAR = [
  'gmail.com', 'googlemail.com', 'hotmail.com', 'outlook.com', 'yahoo.com', 'icloud.com', 'live.com',
  'aol.com', 'msn.com', 'me.com', 'mac.com', 'proton.me', 'protonmail.com', 'gmx.com', 'gmx.net', 'ymail.com',
  'hotmail.co.uk', 'hotmail.fr', 'yahoo.co.uk', 'yahoo.fr', 'orange.fr', 'wanadoo.fr', 'laposte.net',
  'comcast.net', 'verizon.net', 'sbcglobal.net', 'yandex.ru', 'mail.ru', 'web.de', 'free.fr', 'fastmail.com',
];
const MIN_FUZZY_LENGTH = 8;
// `.com` as it gets mistyped.
const COM_TYPOS = new Set(['con', 'cmo', 'ocm', 'vom', 'xom', 'cpm', 'comm', 'coom', 'cm', 'om', 'co', 'c0m', 'cim', 'clm']);

/** Optimal string alignment distance, stopping early past `max`. */
function distance(a: string, b: string, max: number): number {
  if (Math.abs(a.length - b.length) > max) return max + 1;
  const rows: number[][] = [];
  for (let i = 0; i <= a.length; i++) rows.push([i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 0; j <= b.length; j++) rows[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    let best = Infinity;
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, rows[i - 2]![j - 2]! + 1);
      rows[i]![j] = v;
      best = Math.min(best, v);
    }
    if (best > max) return max + 1;
  }
  return rows[a.length]![b.length]!;
}

/** The corrected domain, or null. Never the domain itself. */
export function suggestDomain(domain: string): string | null {
  if (POPULAR.includes(domain) || isFreeProvider(domain)) return null;
  const dot = domain.lastIndexOf('.');
  const name = domain.slice(0, dot);
  const top = domain.slice(dot + 1);
  if (COM_TYPOS.has(top)) {
    const fixed = `${name}.com`;
    if (POPULAR.includes(fixed)) return fixed;
  }
  let found: string | null = null;
  for (const candidate of POPULAR) {
    if (candidate.length < MIN_FUZZY_LENGTH) continue;
    if (distance(domain, candidate, 1) === 1) {
      if (found) return null; // two candidates as close: do not guess
      found = candidate;
    }
  }
  return found;
}

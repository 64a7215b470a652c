import { disposableEmailBlocklistSet } from 'disposable-email-domains-js';

/**
 * The local lists of rule 1 of docs/verification.md. The disposable list is the maintained
 * disposable-email-domains list (npm `disposable-email-domains-js`, updated by upgrading the
 * package); the others are pinned here, and the operator adds blocked domains with
 * VERIFY_BLOCKED_DOMAINS. A domain matches a list when it or one of its parent domains is on it.
 */

const disposable = disposableEmailBlocklistSet();

/** Major free mailbox providers: a trait only (rule 4). */
const FREE_PROVIDERS = new Set([
  'gmail.com', 'googlemail.com', 'outlook.com', 'hotmail.com', 'hotmail.co.uk', 'hotmail.fr', 'hotmail.de',
  'hotmail.it', 'hotmail.es', 'live.com', 'live.fr', 'live.co.uk', 'msn.com', 'yahoo.com', 'yahoo.co.uk',
  'yahoo.fr', 'yahoo.de', 'yahoo.es', 'yahoo.it', 'yahoo.co.jp', 'yahoo.com.br', 'ymail.com', 'rocketmail.com',
  'aol.com', 'icloud.com', 'me.com', 'mac.com', 'proton.me', 'protonmail.com', 'pm.me', 'gmx.com', 'gmx.net',
  'gmx.de', 'gmx.fr', 'web.de', 't-online.de', 'mail.com', 'zoho.com', 'zohomail.com', 'yandex.com', 'yandex.ru',
  'mail.ru', 'bk.ru', 'inbox.ru', 'list.ru', 'rambler.ru', 'qq.com', '163.com', '126.com', 'sina.com', 'naver.com',
  'daum.net', 'hanmail.net', 'orange.fr', 'wanadoo.fr', 'free.fr', 'laposte.net', 'sfr.fr', 'libero.it',
  'virgilio.it', 'seznam.cz', 'wp.pl', 'o2.pl', 'interia.pl', 'tutanota.com', 'tuta.io', 'fastmail.com',
  'hey.com', 'comcast.net', 'verizon.net', 'att.net', 'sbcglobal.net', 'bellsouth.net', 'cox.net',
  'rediffmail.com', 'uol.com.br', 'bol.com.br', 'terra.com.br',
]);

/**
 * Major consumer providers whose routing is cached 7 days instead of 12 hours (rule 9):
 * their MX records change rarely and they are most of the traffic.
 */
export const PINNED_PROVIDERS = new Set([
  'gmail.com', 'googlemail.com', 'outlook.com', 'hotmail.com', 'live.com', 'msn.com', 'yahoo.com', 'ymail.com',
  'aol.com', 'icloud.com', 'me.com', 'mac.com', 'proton.me', 'protonmail.com', 'gmx.com', 'gmx.de', 'web.de',
  'yandex.ru', 'mail.ru', 'qq.com', '163.com', 'orange.fr', 'free.fr',
]);

/** Forwarding services that hide the real mailbox: accepted with warning `privacy_alias`. */
const PRIVACY_ALIAS_DOMAINS = new Set([
  'privaterelay.appleid.com', // Apple Hide My Email
  'mozmail.com', // Firefox Relay
  'relay.firefox.com',
  'duck.com', // DuckDuckGo Email Protection
  'simplelogin.com', 'simplelogin.co', 'simplelogin.fr', 'aleeas.com', 'slmail.me', 'silomails.com', 'slmails.com', '8alias.com', '8shield.net', 'dralias.com', // SimpleLogin
  'addy.io', 'anonaddy.com', 'anonaddy.me', // addy.io (and its user subdomains)
  'passmail.net', 'passmail.com', 'passinbox.com', // Proton Pass
  '33mail.com', 'erine.email', 'spamgourmet.com',
]);

/**
 * Top-level domains handed out free and seen again and again in abuse (the former Freenom
 * TLDs and a few others): warning `suspicious_domain`, never a rejection (rule 4).
 */
const SUSPICIOUS_TLDS = new Set(['tk', 'ml', 'ga', 'cf', 'gq', 'xyz', 'top', 'click', 'loan', 'work', 'rest', 'cam']);

/** RFC 2606 / RFC 6761 names that never receive real mail: `test_email`. */
const RESERVED_DOMAINS = new Set(['example.com', 'example.net', 'example.org']);
const RESERVED_TLDS = new Set(['test', 'example', 'invalid', 'localhost', 'local']);

/** Local parts typed to get past a form: `test_email` on any domain. */
const TEST_LOCAL_PARTS = new Set([
  'test', 'tester', 'testing', 'test1', 'test123', 'testuser', 'testemail', 'example', 'sample', 'foo', 'foobar',
  'asdf', 'qwerty', 'fake', 'nobody', 'noemail', 'none', 'null', 'john.doe', 'jane.doe', 'user', 'username',
]);

/** Mailboxes of a function rather than a person: warning `role_based` (-10). */
const ROLE_LOCAL_PARTS = new Set([
  'abuse', 'accounting', 'accounts', 'admin', 'administrator', 'billing', 'careers', 'contact', 'customerservice',
  'dev', 'devnull', 'enquiries', 'feedback', 'finance', 'hello', 'help', 'helpdesk', 'hostmaster', 'hr', 'info',
  'it', 'jobs', 'legal', 'mail', 'mailer-daemon', 'marketing', 'media', 'newsletter', 'no-reply', 'noreply',
  'office', 'ops', 'orders', 'postmaster', 'press', 'privacy', 'root', 'sales', 'security', 'service', 'support',
  'sysadmin', 'team', 'webmaster',
]);

/**
 * Mailbox names that look generated or hostile rather than chosen by a person: warning
 * `spam_like` (-30). Words about spam, keyboard runs, long digit runs, one character repeated.
 */
const SPAM_LIKE_PATTERNS: RegExp[] = [
  /spam|junk|trash|garbage|throwaway|burner|fakemail|nospam/,
  /qwert|asdfg|zxcvb|yxcvb|azerty|hjkl/,
  /\d{7,}/,
  /([a-z0-9])\1{4,}/,
  /^[bcdfghjklmnpqrstvwxz]{8,}$/, // eight or more consonants and nothing else
];

export type DomainCategory =
  | 'free'
  | 'business'
  | 'disposable'
  | 'blocked'
  | 'privacy'
  | 'education'
  | 'government'
  | 'reserved'
  | 'unknown';

/** The domain and each parent domain that still has two labels: a.b.example.com → …, example.com. */
function domainAndParents(domain: string): string[] {
  const labels = domain.split('.');
  const out: string[] = [];
  for (let i = 0; i <= labels.length - 2; i++) out.push(labels.slice(i).join('.'));
  return out;
}

function onList(list: Set<string>, domain: string): boolean {
  return domainAndParents(domain).some((d) => list.has(d));
}

export function tld(domain: string): string {
  return domain.slice(domain.lastIndexOf('.') + 1);
}

export const isDisposableDomain = (domain: string) => onList(disposable, domain);
export const isFreeProvider = (domain: string) => FREE_PROVIDERS.has(domain);
export const isPrivacyAlias = (domain: string) => onList(PRIVACY_ALIAS_DOMAINS, domain);
export const isSuspiciousTld = (domain: string) => SUSPICIOUS_TLDS.has(tld(domain));
export const isReservedDomain = (domain: string) => onList(RESERVED_DOMAINS, domain) || RESERVED_TLDS.has(tld(domain));
export const isTestLocalPart = (local: string) => TEST_LOCAL_PARTS.has(local);
export const isPinnedProvider = (domain: string) => PINNED_PROVIDERS.has(domain);
export const isBlockedDomain = (blocked: ReadonlySet<string>, domain: string) => onList(blocked as Set<string>, domain);

/** The part before a `+tag` decides: `info+x@` is still `info@`. */
function baseLocal(local: string): string {
  const plus = local.indexOf('+');
  return plus > 0 ? local.slice(0, plus) : local;
}

export const isRoleLocalPart = (local: string) => ROLE_LOCAL_PARTS.has(baseLocal(local));
export const isSpamLikeLocalPart = (local: string) => {
  const base = baseLocal(local);
  return SPAM_LIKE_PATTERNS.some((p) => p.test(base));
};

export function isEducation(domain: string): boolean {
  const labels = domain.split('.');
  const n = labels.length;
  return labels[n - 1] === 'edu' || (n >= 3 && ['edu', 'ac'].includes(labels[n - 2]!) && labels[n - 1]!.length === 2);
}

export function isGovernment(domain: string): boolean {
  const labels = domain.split('.');
  const n = labels.length;
  if (['gov', 'mil'].includes(labels[n - 1]!)) return true;
  return n >= 3 && ['gov', 'gouv', 'gob', 'govt', 'mil'].includes(labels[n - 2]!) && labels[n - 1]!.length === 2;
}

/** docs/verification.md lists the categories; the first that applies wins. */
export function domainCategory(domain: string | null, flags: { blocked: boolean }): DomainCategory {
  if (!domain) return 'unknown';
  if (isReservedDomain(domain)) return 'reserved';
  if (isPrivacyAlias(domain)) return 'privacy';
  if (flags.blocked) return 'blocked';
  if (isDisposableDomain(domain)) return 'disposable';
  if (isFreeProvider(domain)) return 'free';
  if (isEducation(domain)) return 'education';
  if (isGovernment(domain)) return 'government';
  return 'business';
}

import type { FixtureZone } from './dns-server.js';

/**
 * The DNS zone every example of docs/verification.md is produced against (test/verification.test.ts).
 * 192.0.2.0/24 and 2001:db8::/32 are documentation ranges.
 */
export const VERIFICATION_ZONE: FixtureZone = {
  // Consumer providers (pinned: 7-day routing cache).
  'gmail.com': { mx: [{ priority: 5, exchange: 'gmail-smtp-in.l.google.com' }, { priority: 10, exchange: 'alt1.gmail-smtp-in.l.google.com' }] },
  'gmail-smtp-in.l.google.com': { a: ['192.0.2.10'] },
  'alt1.gmail-smtp-in.l.google.com': { a: ['192.0.2.11'] },
  'outlook.com': { mx: [{ priority: 10, exchange: 'mx.outlook.com' }] },
  'mx.outlook.com': { a: ['192.0.2.12'] },
  // A business domain with MX, and more of the same for tests that need a fresh cache.
  'acme.io': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'mx.acme.io': { a: ['192.0.2.20'] },
  'fresh.io': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'quota.io': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  // Only the AAAA of the exchange.
  'v6.io': { mx: [{ priority: 10, exchange: 'mx.v6.io' }] },
  'mx.v6.io': { aaaa: ['2001:db8::25'] },
  // No MX: the implicit MX of RFC 5321 5.1 (the domain's own A).
  'implicit.io': { a: ['192.0.2.30'] },
  'implicit6.io': { aaaa: ['2001:db8::30'] },
  // RFC 7505 null MX: publishes that it accepts no mail.
  'nullmx.io': { mx: [{ priority: 0, exchange: '' }], a: ['192.0.2.31'] },
  // Exists, but neither MX nor A/AAAA.
  'noroute.io': { txt: ['v=spf1 -all'] },
  // An MX whose exchange does not resolve.
  'deadmx.io': { mx: [{ priority: 10, exchange: 'gone.deadmx.io' }] },
  // Three exchanges without an address before one that has one: a sending MTA gets there.
  'mx4.io': {
    mx: [
      { priority: 10, exchange: 'd1.mx4.io' },
      { priority: 10, exchange: 'd2.mx4.io' },
      { priority: 10, exchange: 'd3.mx4.io' },
      { priority: 20, exchange: 'mx.v6.io' },
    ],
  },
  // Every query fails (SERVFAIL): a temporary failure.
  'flaky.io': { servfail: true },
  // Fails until a test publishes its MX.
  'recovering.io': { servfail: true },
  // Typo domains that do route mail (as typo-squatters' domains often do).
  'gamil.com': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'outlok.com': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  // Privacy relays.
  'privaterelay.appleid.com': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'mozmail.com': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'duck.com': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'simplelogin.com': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'jane.anonaddy.com': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'addy.io': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  // A free, much-abused TLD.
  'promo.tk': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  // Education and government.
  'state.edu': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'city.gov': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'ox.ac.uk': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  // Domains that history marks (see the tests).
  'bouncy.io': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  'catchall.io': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
  // IDN: münchen.de as its A-label.
  'xn--mnchen-3ya.de': { mx: [{ priority: 10, exchange: 'mx.acme.io' }] },
};

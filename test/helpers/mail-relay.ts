import { Resolver } from 'node:dns/promises';
import { dkimVerify } from 'mailauth/lib/dkim/verify.js';
import { createTestContext, type TestContext } from './context.js';
import { startDnsServer, type TestDnsServer } from './dns-server.js';
import { startSmtpSink, type SmtpSink } from './smtp-sink.js';

/**
 * The set-up of the tests that follow mail to the relay and check its DKIM signature
 * (test/smtp.test.ts, test/domains-e2e.test.ts): a test DNS server, an SMTP sink as the relay,
 * and a test context that resolves through the one and relays to the other, refusing to send
 * from unverified domains (ALLOW_UNVERIFIED_DOMAINS=false).
 */
export interface MailRelay {
  dns: TestDnsServer;
  sink: SmtpSink;
  ctx: TestContext;
}

export async function startMailRelay(overrides: Record<string, string> = {}): Promise<MailRelay> {
  const dns = await startDnsServer();
  const sink = await startSmtpSink();
  const ctx = await createTestContext({
    DNS_SERVERS: dns.address,
    MAIL_TRANSPORT: 'smtp',
    SMTP_URL: sink.url,
    ALLOW_UNVERIFIED_DOMAINS: 'false',
    ...overrides,
  });
  return { dns, sink, ctx };
}

/** The first DKIM signature's result for a relayed message, its key read from the test DNS server. */
export async function dkimResult(dns: TestDnsServer, raw: Buffer) {
  const resolver = new Resolver();
  resolver.setServers([dns.address]);
  const result = await dkimVerify(raw, { resolver: (name: string, type: string) => resolver.resolve(name, type as 'TXT') } as never);
  return (result as { results: Array<{ signingDomain: string; status: { result: string } }> }).results[0];
}

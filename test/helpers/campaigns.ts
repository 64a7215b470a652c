import { generateKeyPairSync } from 'node:crypto';
import type { Services } from '../../src/shared/container.js';
import { newId } from '../../src/shared/ids.js';

// One DKIM key for every test domain: the send path signs mail from a domain of the organization.
let privateKey: string | undefined;

/** A domain (VERIFIED, with a DKIM key) and a sender of the organization, written directly (no DNS needed). */
export async function createSenderRow(
  services: Services,
  organizationId: string,
  email = 'news@example.test',
  name = 'Acme News',
  /** The domain row's name; another name than the sender's leaves its mail unsigned. */
  domainName = email.split('@')[1]!,
): Promise<string> {
  privateKey ??= generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const em = services.orm.em.fork();
  const domainId = newId('dom');
  const senderId = newId('snd');
  await em.execute(
    `insert into domains (id, organization_id, domain, region, status, dkim_selector, dkim_private_key_sealed, dns_records, created_at, updated_at)
     values (?, ?, ?, 'eu-west-1', 'VERIFIED', 'mr', ?, '[]'::jsonb, now(), now())`,
    [domainId, organizationId, domainName, services.box.seal(privateKey)],
    'run',
  );
  await em.execute(`insert into senders (id, organization_id, domain_id, name, email, created_at) values (?, ?, ?, ?, ?, now())`, [senderId, organizationId, domainId, name, email], 'run');
  return senderId;
}

/**
 * `count` SUBSCRIBED subscribers `user<i>@<domain>` in one statement; ids are sortable
 * like the service's own (sub_ + 26 base32 characters).
 */
export async function seedSubscribers(
  services: Services,
  organizationId: string,
  count: number,
  options: { domain?: string; fields?: Record<string, string>; start?: number } = {},
): Promise<void> {
  const start = options.start ?? 0;
  await services.orm.em.fork().execute(
    `insert into subscribers (id, organization_id, email, name, status, fields, created_at, updated_at)
     select 'sub_0' || lpad(to_hex(? + i), 25, '0'), ?, 'user' || (? + i) || '@' || ?, 'User ' || (? + i), 'SUBSCRIBED', ?::jsonb, now(), now()
     from generate_series(0, ? - 1) as i`,
    [start, organizationId, start, options.domain ?? 'example.net', start, JSON.stringify(options.fields ?? {}), count],
    'run',
  );
}

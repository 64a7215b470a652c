import type { EntityManager } from '@mikro-orm/postgresql';
import type { LinkSigner } from '../crypto.js';
import type { QueueProducer } from '../queues/producer.js';
import { unsubscribeSubscriber } from '../subscribers/service.js';
import { UNSUBSCRIBE_PURPOSE } from './personalize.js';
import { selectUnsubscribeTarget } from './queries.js';

/**
 * `/u/{token}` (docs/campaigns.md "Personalisation and unsubscribe"): the token signs the
 * subscriber id. GET only reads (link scanners open links); POST, from the page's button or a mail
 * client's RFC 8058 one-click request, unsubscribes.
 */
export interface UnsubscribeTarget {
  subscriberId: string;
  organizationId: string;
  organizationName: string;
  email: string;
  status: string;
}

export async function resolveUnsubscribeToken(em: EntityManager, signer: LinkSigner, token: string): Promise<UnsubscribeTarget | null | 'gone'> {
  const value = signer.verify(UNSUBSCRIBE_PURPOSE, token);
  if (!value) return null;
  const subscriberId = value.split(' ')[0]!;
  const row = await selectUnsubscribeTarget(em, subscriberId);
  if (!row) return 'gone';
  return { subscriberId: row.id, organizationId: row.organization_id, organizationName: row.org_name, email: row.email, status: row.status };
}

export async function unsubscribeByToken(
  deps: { em: EntityManager; producer: QueueProducer; clock: () => Date },
  signer: LinkSigner,
  token: string,
): Promise<UnsubscribeTarget | null | 'gone'> {
  const target = await resolveUnsubscribeToken(deps.em, signer, token);
  if (!target || target === 'gone') return target;
  if (target.status === 'SUBSCRIBED' || target.status === 'PENDING_CONFIRMATION') {
    await unsubscribeSubscriber(deps, target.organizationId, target.subscriberId, { triggerWorkflows: true });
  }
  return target;
}

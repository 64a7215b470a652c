import { raw, type EntityManager } from '@mikro-orm/postgresql';
import { Sender } from '../db/entities/index.js';

/** The data access of sending domains beyond the ORM entities' find and persist. */

/** How many senders each of these domains has (a domain without any is absent). */
export async function countSendersByDomain(em: EntityManager, domainIds: readonly string[]): Promise<Map<string, number>> {
  const rows: Array<{ domainId: string; count: string }> = await em
    .createQueryBuilder(Sender)
    .select(['domainId', raw('count(*) as count')])
    .where({ domainId: { $in: [...domainIds] } })
    .groupBy('domainId')
    .execute('all', true);
  return new Map(rows.map((row) => [row.domainId, Number(row.count)]));
}

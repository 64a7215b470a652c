import type { EntityManager } from '@mikro-orm/postgresql';

/** The data access of organizations outside the ORM entity. */

type Execute = Pick<EntityManager, 'execute'>;

export async function organizationExists(em: Execute, id: string): Promise<boolean> {
  const org = await em.execute<{ id: string }[]>('select id from organizations where id = ?', [id], 'all');
  return org.length > 0;
}

export interface OrganizationListRow {
  id: string;
  name: string;
  double_opt_in: boolean;
  verify_quota: number;
  created_at: Date;
  /** A bigint count, as text. */
  tokens: string;
}

/** Every organization, oldest first, with its token count (`cli org list`). */
export async function selectOrganizationsWithTokenCounts(em: Execute): Promise<OrganizationListRow[]> {
  return em.execute<OrganizationListRow[]>(
    `select o.id, o.name, o.double_opt_in, o.verify_quota, o.created_at,
              (select count(*) from api_tokens t where t.organization_id = o.id) as tokens
         from organizations o order by o.created_at, o.id`,
  );
}

import type { EntityManager } from '@mikro-orm/postgresql';

/** The data access of API tokens outside the ORM entity. */

type Execute = Pick<EntityManager, 'execute'>;

/** Deletes a token, of this organization unless it is null; the row deleted, if any. */
export async function deleteToken(em: Execute, organizationId: string | null, tokenId: string): Promise<{ id: string; organization_id: string } | undefined> {
  const rows = await em.execute<Array<{ id: string; organization_id: string }>>(
    organizationId === null
      ? 'delete from api_tokens where id = ? returning id, organization_id'
      : 'delete from api_tokens where id = ? and organization_id = ? returning id, organization_id',
    organizationId === null ? [tokenId] : [tokenId, organizationId],
  );
  return rows[0];
}

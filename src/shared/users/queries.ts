import type { EntityManager } from '@mikro-orm/postgresql';

/** The data access of dashboard users (`users`). */

type Execute = Pick<EntityManager, 'execute'>;

export interface UserRow {
  id: string;
  organization_id: string;
  email: string;
  created_at: Date;
}

/** The new user, or undefined when the address is taken. */
export async function insertUser(em: Execute, user: { id: string; organizationId: string; email: string; passwordHash: string }): Promise<UserRow | undefined> {
  const rows = await em.execute<UserRow[]>(
    `insert into users (id, organization_id, email, password_hash) values (?, ?, ?, ?)
     on conflict (email) do nothing returning id, organization_id, email, created_at`,
    [user.id, user.organizationId, user.email, user.passwordHash],
    'all',
  );
  return rows[0];
}

export async function selectUsersOf(em: Execute, organizationId: string): Promise<UserRow[]> {
  return em.execute<UserRow[]>('select id, organization_id, email, created_at from users where organization_id = ? order by id', [organizationId], 'all');
}

export async function selectUserWithHash(em: Execute, email: string): Promise<(UserRow & { password_hash: string }) | undefined> {
  const rows = await em.execute<Array<UserRow & { password_hash: string }>>(
    'select id, organization_id, email, created_at, password_hash from users where email = ?',
    [email],
    'all',
  );
  return rows[0];
}

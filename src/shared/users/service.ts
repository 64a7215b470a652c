import type { EntityManager } from '@mikro-orm/postgresql';
import { hash, verify } from 'argon2';
import { z } from 'zod';
import { NotFoundError, ValidationError } from '../errors.js';
import { newId } from '../ids.js';
import { organizationExists } from '../organizations/queries.js';
import { insertUser, selectUserWithHash, selectUsersOf } from './queries.js';

/** A person of an organization who signs in to the dashboard (docs/dashboard.md "Getting in"). */
export interface User {
  id: string;
  organizationId: string;
  email: string;
  createdAt: Date;
}

// Long passphrases are welcome; the upper bound only keeps one hash cheap to refuse.
export const PASSWORD_MIN = 10;
export const PASSWORD_MAX = 1024;

const Email = z.email({ error: 'must be an email address' }).max(254, 'must be at most 254 characters');

export function normalizeUserEmail(value: string): string {
  return value.trim().toLowerCase();
}

function toUser(row: { id: string; organization_id: string; email: string; created_at: Date | string }): User {
  return { id: row.id, organizationId: row.organization_id, email: row.email, createdAt: new Date(row.created_at) };
}

/**
 * Argon2id with the library's defaults (64 MiB, 3 passes): memory-hard, as OWASP
 * recommends for passwords; `argon2` ships prebuilt binaries inside its npm package.
 */
export async function createUser(em: EntityManager, input: { organizationId: string; email: string; password: string }): Promise<User> {
  const email = normalizeUserEmail(input.email);
  const parsed = Email.safeParse(email);
  if (!parsed.success) throw new ValidationError(`email: ${parsed.error.issues[0]?.message}`, [{ path: 'email', message: parsed.error.issues[0]?.message ?? 'invalid' }]);
  if (input.password.length < PASSWORD_MIN || input.password.length > PASSWORD_MAX) {
    const message = `must be ${PASSWORD_MIN} to ${PASSWORD_MAX} characters`;
    throw new ValidationError(`password: ${message}`, [{ path: 'password', message }]);
  }
  if (!(await organizationExists(em, input.organizationId))) throw new NotFoundError(`No organization ${input.organizationId}`);
  const passwordHash = await hash(input.password);
  const row = await insertUser(em, { id: newId('usr'), organizationId: input.organizationId, email, passwordHash });
  if (!row) throw new ValidationError(`email: a user ${email} already exists`, [{ path: 'email', message: 'already taken' }]);
  return toUser(row);
}

export async function listUsers(em: EntityManager, organizationId: string): Promise<User[]> {
  if (!(await organizationExists(em, organizationId))) throw new NotFoundError(`No organization ${organizationId}`);
  return (await selectUsersOf(em, organizationId)).map(toUser);
}

// Verified against when the address is unknown, so that an unknown address costs as long
// as a wrong password and timing does not tell which addresses exist. A constant: argon2's
// `hash` of a password no one has, with the same parameters as the users' (m, t, p; a test
// checks that they stay the same).
export const DECOY_HASH = '$argon2id$v=19$m=65536,p=4,t=3$nY2RG2E8/FrZAfRSLGOYcA$ILrIL/lguiDu5uAPcrJBPdefDBN9jhQ6BQZZCp+XO2k';

/** The user whose address and password these are, or null. */
export async function checkPassword(em: EntityManager, email: string, password: string): Promise<User | null> {
  if (password.length > PASSWORD_MAX) return null;
  const row = await selectUserWithHash(em, normalizeUserEmail(email));
  if (!row) {
    await verify(DECOY_HASH, password).catch(() => false);
    return null;
  }
  return (await verify(row.password_hash, password).catch(() => false)) ? toUser(row) : null;
}

import type { EntityManager } from '@mikro-orm/postgresql';
import { randomHex, sha256Hex, type SecretBox } from '../crypto.js';
import { ApiToken } from '../db/entities/index.js';
import { PermissionError, ValidationError } from '../errors.js';
import { newId } from '../ids.js';
import { lockForTransaction } from '../db/queries.js';
import { holdsAll, normalizePermissions, PRESETS, type Permission, type Preset } from './permissions.js';

export const TOKEN_PREFIX = 'svc_';

export interface Caller {
  organizationId: string;
  tokenId: string;
  permissions: string[];
}

export interface CreateTokenInput {
  name: string;
  reuseIfExists?: boolean;
  permissions?: Permission[];
  preset?: Preset;
}

export interface CreatedToken {
  id: string;
  name: string;
  token: string;
  permissions: string[];
  createdAt: Date;
  reused: boolean;
}

export function mintSecret(): string {
  return `${TOKEN_PREFIX}${randomHex(32)}`;
}

export function looksLikeSecret(value: string): boolean {
  return /^svc_[0-9a-f]{64}$/.test(value);
}

/** Inserts a token row; the caller owns the transaction. */
export function insertToken(
  em: EntityManager,
  box: SecretBox,
  input: { organizationId: string; name: string; permissions: readonly string[] },
): { entity: ApiToken; secret: string } {
  const secret = mintSecret();
  const entity = em.create(ApiToken, {
    id: newId('tok'),
    organizationId: input.organizationId,
    name: input.name,
    tokenHash: sha256Hex(secret),
    secretSealed: box.seal(secret),
    last4: secret.slice(-4),
    permissions: normalizePermissions(input.permissions),
    createdAt: new Date(),
  });
  return { entity, secret };
}

/**
 * docs/foundation.md "Tokens and permissions": mint a token, or return the existing one of that
 * name. The caller may only hand out scopes it holds, which also guards a reused token's secret.
 */
export async function createToken(
  em: EntityManager,
  box: SecretBox,
  caller: Caller,
  input: CreateTokenInput,
  /** MAX_TOKENS_PER_ORGANIZATION: N tokens would otherwise be N times the per-token rate limit. */
  maxTokens = Number.POSITIVE_INFINITY,
): Promise<CreatedToken> {
  const requested = normalizePermissions(input.preset ? PRESETS[input.preset] : (input.permissions ?? caller.permissions));
  if (!holdsAll(caller.permissions, requested)) {
    throw new PermissionError('The token cannot grant permissions it does not hold itself');
  }
  return em.transactional(async (tx) => {
    if (input.reuseIfExists ?? true) {
      // Serialises concurrent "reuse or mint" calls for one name, so they agree on one token.
      await lockForTransaction(tx, `token:${caller.organizationId}:${input.name}`);
      const existing = await tx.findOne(
        ApiToken,
        { organizationId: caller.organizationId, name: input.name },
        { orderBy: { createdAt: 'asc', id: 'asc' } },
      );
      if (existing) {
        if (!holdsAll(caller.permissions, existing.permissions)) {
          throw new PermissionError('The existing token of that name holds permissions the caller does not');
        }
        return present(existing, box.open(existing.secretSealed), true);
      }
    }
    if (Number.isFinite(maxTokens)) {
      // One organization's token creations in turn, so concurrent ones cannot pass the cap together.
      await lockForTransaction(tx, `token-cap:${caller.organizationId}`);
      const count = await tx.count(ApiToken, { organizationId: caller.organizationId });
      if (count >= maxTokens) {
        throw new ValidationError(
          `This organization has ${count} tokens, the most allowed (MAX_TOKENS_PER_ORGANIZATION); delete one first`,
          [{ path: 'name', message: 'too many tokens in this organization' }],
        );
      }
    }
    const { entity, secret } = insertToken(tx, box, {
      organizationId: caller.organizationId,
      name: input.name,
      permissions: requested,
    });
    return present(entity, secret, false);
  });
}

function present(token: ApiToken, secret: string, reused: boolean): CreatedToken {
  return { id: token.id, name: token.name, token: secret, permissions: token.permissions, createdAt: token.createdAt, reused };
}

export async function listTokens(
  em: EntityManager,
  organizationId: string,
  limit: number | undefined,
): Promise<{ items: ApiToken[]; hasMore: boolean }> {
  const rows = await em.find(
    ApiToken,
    { organizationId },
    { orderBy: { createdAt: 'desc', id: 'desc' }, limit: limit === undefined ? undefined : limit + 1 },
  );
  const hasMore = limit !== undefined && rows.length > limit;
  return { items: hasMore ? rows.slice(0, limit) : rows, hasMore };
}

/** The token a secret belongs to, or null. */
export async function findTokenBySecret(em: EntityManager, secret: string): Promise<ApiToken | null> {
  if (!looksLikeSecret(secret)) return null;
  return em.findOne(ApiToken, { tokenHash: sha256Hex(secret) });
}

import { z } from 'zod';

export const SCOPES = [
  'subscribers',
  'audience',
  'campaigns',
  'send',
  'workflows',
  'emails',
  'analytics',
  'settings',
  'domains',
  'tokens',
] as const;

export const PermissionSchema = z.enum([...SCOPES, '*']);
export type Permission = z.infer<typeof PermissionSchema>;
export type Scope = (typeof SCOPES)[number];

const APP: Permission[] = ['subscribers', 'emails', 'audience'];
const MARKETING: Permission[] = [...APP, 'campaigns', 'analytics', 'workflows'];

export const PRESETS = {
  app: APP,
  marketing: MARKETING,
  sender: [...MARKETING, 'send'],
  full: ['*'],
} as const satisfies Record<string, Permission[]>;

export type Preset = keyof typeof PRESETS;
export const PresetSchema = z.enum(Object.keys(PRESETS) as [Preset, ...Preset[]]);

export function holds(granted: readonly string[], scope: Permission): boolean {
  return granted.includes('*') || granted.includes(scope);
}

export function holdsAll(granted: readonly string[], wanted: readonly string[]): boolean {
  return wanted.every((scope) => holds(granted, scope as Permission));
}

/** Sorted, de-duplicated; `*` alone when present, since it holds every scope. */
export function normalizePermissions(permissions: readonly string[]): Permission[] {
  if (permissions.includes('*')) return ['*'];
  return [...new Set(permissions)].sort() as Permission[];
}

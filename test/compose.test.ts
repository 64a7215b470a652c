import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { loadConfig } from '../src/shared/config.js';

/**
 * docker-compose.yml, read (no Docker engine runs it here). README "Quick start": the quick start
 * `npm install && npm start` works "after `docker compose up -d`", with npm start's defaults.
 */
interface Service {
  profiles?: string[];
  ports?: string[];
  environment?: Record<string, string>;
}

const compose = parse(readFileSync(new URL('../docker-compose.yml', import.meta.url), 'utf8'), {
  merge: true,
}) as { services: Record<string, Service> };
const defaults = loadConfig({});
const hostPort = (binding: string) => binding.split(':').slice(0, -1).join(':');

describe('docker-compose.yml', () => {
  const started = Object.entries(compose.services).filter(([, s]) => !s.profiles?.length);

  it('starts only the dependencies by default, and every role with the profile app', () => {
    expect(started.map(([name]) => name).sort()).toEqual(['mailpit', 'postgres', 'redis']);
    for (const [name, service] of Object.entries(compose.services)) {
      if (!started.some(([n]) => n === name)) expect(service.profiles, name).toEqual(['app']);
    }
  });

  it('publishes PostgreSQL and Redis where the default DATABASE_URL and REDIS_URL look, on the loopback', () => {
    const database = new URL(defaults.databaseUrl);
    const redis = new URL(defaults.redisUrl);
    expect(compose.services.postgres.ports).toContain(`${database.hostname}:${database.port}:5432`);
    expect(compose.services.redis.ports).toContain(`${redis.hostname}:${redis.port}:6379`);
    for (const [, service] of started) {
      for (const binding of service.ports ?? []) expect(hostPort(binding)).toMatch(/^127\.0\.0\.1:/);
    }
  });

  it("lets npm start's default user into its database without a password by default", () => {
    const database = new URL(defaults.databaseUrl);
    const env = compose.services.postgres.environment ?? {};
    expect(database.password).toBe('');
    expect(env.POSTGRES_USER ?? 'postgres').toBe(decodeURIComponent(database.username));
    expect(env.POSTGRES_DB).toBe(database.pathname.slice(1));
    expect(env.POSTGRES_HOST_AUTH_METHOD).toBe('${POSTGRES_HOST_AUTH_METHOD:-trust}');
  });

  it('gives the roles the same user and database, with the password PostgreSQL was given', () => {
    const url = compose.services.api.environment?.DATABASE_URL ?? '';
    expect(url).toBe('postgres://postgres:${POSTGRES_PASSWORD:-}@postgres:5432/mailroom');
    expect(compose.services.postgres.environment?.POSTGRES_PASSWORD).toBe('${POSTGRES_PASSWORD:-}');
  });

  it('takes none of the ports npm start listens on unless the profile app is on', () => {
    const ours = [defaults.port, defaults.inbound.port, defaults.smtpSubmission.port];
    const published = (services: [string, Service][]) =>
      services.flatMap(([, s]) =>
        (s.ports ?? []).flatMap((binding) => {
          const [first, last = first] = hostPort(binding).split(':').pop()!.split('-').map(Number);
          return Array.from({ length: last - first + 1 }, (_, i) => first + i);
        }),
      );
    expect(published(started).filter((port) => ours.includes(port))).toEqual([]);
    // The profile's API does take npm start's port: the README says to run one or the other.
    expect(published(Object.entries(compose.services))).toContain(defaults.port);
  });
});

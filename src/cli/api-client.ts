import { setTimeout as sleep } from 'node:timers/promises';
import { AppError } from '../shared/errors.js';

/** Where the user commands send their calls: MAILROOM_URL (default local) and MAILROOM_TOKEN. */
export interface ApiTarget {
  base: string;
  token: string;
}

/** The API and token of the environment; undefined without MAILROOM_TOKEN. */
export function apiTarget(): ApiTarget | undefined {
  const token = process.env.MAILROOM_TOKEN;
  if (!token) return undefined;
  return { base: (process.env.MAILROOM_URL || 'http://127.0.0.1:3000').replace(/\/+$/, ''), token };
}

// A 429 is waited out (its Retry-After, a second without one) this many times, then reported.
const RATE_LIMITED_TRIES = 5;

/** A user command's call to the API; an error body becomes an AppError with its message. */
export async function callApi(target: ApiTarget, method: string, path: string, body: unknown): Promise<unknown> {
  for (let attempt = 1; ; attempt++) {
    let response: Response;
    try {
      response = await fetch(`${target.base}${path}`, {
        method,
        headers: { authorization: `Bearer ${target.token}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    } catch (error) {
      throw new AppError(503, 'service_unavailable', `cannot reach ${target.base}: ${(error as Error).message}`);
    }
    const answer = (await response.json().catch(() => null)) as { name?: string; message?: string } | null;
    if (response.status === 429 && attempt < RATE_LIMITED_TRIES) {
      await sleep(Math.min(Number(response.headers.get('retry-after')) || 1, 60) * 1000);
      continue;
    }
    if (!response.ok) {
      throw new AppError(response.status, answer?.name ?? 'error', `${response.status} ${answer?.name ?? ''}: ${answer?.message ?? response.statusText}`);
    }
    return answer;
  }
}

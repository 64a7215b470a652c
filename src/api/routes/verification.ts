import { z } from 'zod';
import { verificationDeps, verifyEmail } from '../../shared/verification/index.js';
import { Timestamp } from '../schemas.js';
import type { App } from '../types.js';

export const VerifyBody = z.object({
  // Any string is checked and answered with 200 (an impossible one is `invalid_format`);
  // only a missing or non-string `email` is a 422 (docs/verification.md).
  email: z.string({ error: 'is required and must be a string' }),
});

const IssueSchema = z.object({
  code: z.string(),
  message: z.string(),
  severity: z.enum(['error', 'warning']),
  retryable: z.boolean(),
}).meta({ id: 'VerificationIssue' });

const VerificationSchema = z.object({
  object: z.literal('email_verification'),
  id: z.string(),
  email: z.string(),
  result: z.enum(['deliverable', 'risky', 'undeliverable', 'unknown']),
  accept: z.boolean(),
  status: z.enum(['completed', 'skipped', 'failed']),
  score: z.number().int().min(0).max(100).nullable(),
  suggestion: z.string().nullable(),
  traits: z.object({
    domain_category: z.enum(['free', 'business', 'disposable', 'blocked', 'privacy', 'education', 'government', 'reserved', 'unknown']),
    disposable: z.boolean(),
    free_provider: z.boolean(),
    privacy_alias: z.boolean(),
    role_based: z.boolean(),
    suspicious_domain: z.boolean(),
  }),
  issues: z.array(IssueSchema),
  quota: z.object({ limit: z.number().int(), used: z.number().int(), remaining: z.number().int(), resets_at: Timestamp }),
  retry_at: Timestamp.nullable(),
  cache_hit: z.boolean(),
}).meta({ id: 'Verification' });

export async function verificationRoutes(app: App): Promise<void> {
  // `POST /verify` and its older twin `POST /emails/verify` (docs/verification.md): same body, same answer.
  for (const [url, summary] of [
    ['/verify', 'Verify an email address'],
    ['/emails/verify', 'Verify an email address (older path, same as POST /verify)'],
  ] as const) {
    app.post(
      url,
      {
        config: { permission: 'emails' },
        schema: { tags: ['verification'], summary, body: VerifyBody, response: { 200: VerificationSchema } },
      },
      async (request) => {
        const verification = await verifyEmail(verificationDeps(app.services), {
          organizationId: request.caller.organizationId,
          email: request.body.email,
        });
        app.services.metrics.verificationChecks.inc({ result: verification.result });
        return verification;
      },
    );
  }
}

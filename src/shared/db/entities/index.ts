import { ApiTokenSchema } from './api-token.js';
import { OrganizationSchema } from './organization.js';
import { EmailVerificationSchema } from './email-verification.js';
import { VerificationHistorySchema } from './verification-history.js';

export { ApiToken } from './api-token.js';
export { Organization } from './organization.js';
export { EmailVerification } from './email-verification.js';
export { VerificationHistory } from './verification-history.js';

/** Every entity of the service; each feature appends its own. */
export const entities = [OrganizationSchema, ApiTokenSchema, EmailVerificationSchema, VerificationHistorySchema];

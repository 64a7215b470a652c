import { ApiTokenSchema } from './api-token.js';
import { EmailSchema } from './email.js';
import { OrganizationSchema } from './organization.js';

export { ApiToken } from './api-token.js';
export { Email } from './email.js';
export { Organization } from './organization.js';

/** Every entity of the service; each feature appends its own. */
export const entities = [OrganizationSchema, ApiTokenSchema, EmailSchema];

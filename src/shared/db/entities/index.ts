import { ApiTokenSchema } from './api-token.js';
import { DomainSchema } from './domain.js';
import { OrganizationSchema } from './organization.js';
import { SenderSchema } from './sender.js';

export { ApiToken } from './api-token.js';
export { Organization } from './organization.js';
export { Domain, type DomainDnsRecord, type DomainStatus } from './domain.js';
export { Sender } from './sender.js';

/** Every entity of the service; each feature appends its own. */
export const entities = [OrganizationSchema, ApiTokenSchema, DomainSchema, SenderSchema];

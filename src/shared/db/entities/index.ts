import { ApiTokenSchema } from './api-token.js';
import { DomainSchema } from './domain.js';
import { EmailSchema } from './email.js';
import { OrganizationSchema } from './organization.js';
import { SenderSchema } from './sender.js';
import { SubscriberEventSchema } from './subscriber-event.js';
import { SubscriberSchema } from './subscriber.js';
import { SubscriberTagSchema, TagSchema } from './tag.js';
import { EmailVerificationSchema } from './email-verification.js';
import { VerificationHistorySchema } from './verification-history.js';
import { CampaignSchema } from './campaign.js';
import { SuppressionSchema } from './suppression.js';

export { ApiToken } from './api-token.js';
export { Email } from './email.js';
export { Organization } from './organization.js';
export { Domain, type DomainDnsRecord, type DomainStatus } from './domain.js';
export { Sender } from './sender.js';
export { Subscriber, SUBSCRIBER_STATUSES, type SubscriberStatus } from './subscriber.js';
export { SubscriberEvent } from './subscriber-event.js';
export { SubscriberTag, Tag } from './tag.js';
export { EmailVerification } from './email-verification.js';
export { VerificationHistory } from './verification-history.js';
export { Campaign, CAMPAIGN_STATUSES, CONTENT_TYPES, type CampaignStatus, type CampaignContentType, type RecipientFilter } from './campaign.js';
export { Suppression, type SuppressionReason } from './suppression.js';

/** Every entity of the service; each feature appends its own, one a line. */
export const entities = [
  OrganizationSchema,
  ApiTokenSchema,
  DomainSchema,
  SenderSchema,
  SubscriberSchema,
  TagSchema,
  SubscriberTagSchema,
  SubscriberEventSchema,
  EmailVerificationSchema,
  VerificationHistorySchema,
  EmailSchema,
  CampaignSchema,
  SuppressionSchema,
];

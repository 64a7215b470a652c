import { Migration20261123000000Foundation } from './20261123000000-foundation.js';
import { Migration20261123010000Emails } from './20261123010000-emails.js';
import { Migration20261123020000Audience } from './20261123020000-audience.js';
import { Migration20261123030000Domains } from './20261123030000-domains.js';
import { Migration20261123040000Verification } from './20261123040000-verification.js';
import { Migration20261123050000Campaigns } from './20261123050000-campaigns.js';
import { Migration20261123060000Outcomes } from './20261123060000-outcomes.js';
import { Migration20261123070000EmailEventsCleanup } from './20261123070000-email-events-cleanup.js';
import { Migration20261123080000CampaignTemplates } from './20261123080000-campaign-templates.js';
import { Migration20261125015000EmailsOrganizationTrigger } from './20261125015000-emails-organization-trigger.js';
import { Migration20261125050000InboundReports } from './20261125050000-inbound-reports.js';
import { Migration20261125040000Webhooks } from './20261125040000-webhooks.js';
import { Migration20261125060000ProviderEvents } from './20261125060000-provider-events.js';
import { Migration20261125070000Submissions } from './20261125070000-submissions.js';
import { Migration20261125080000Users } from './20261125080000-users.js';
import { Migration20261125110000EmailBareAddress } from './20261125110000-email-bare-address.js';
import { Migration20261125120000SubscriberConfirmations } from './20261125120000-subscriber-confirmations.js';
import { Migration20261125121000CopyRecipientEvents } from './20261125121000-copy-recipient-events.js';
import { Migration20261125220000EmailsRecipientBareAddress } from './20261125220000-emails-recipient-bare-address.js';
import { Migration20261126010000EmailsRecipientAddressIndex } from './20261126010000-emails-recipient-address-index.js';
import { Migration20261128150000InboundReportsLz4 } from './20261128150000-inbound-reports-lz4.js';
import { Migration20261208020000AttachmentAlternative } from './20261208020000-attachment-alternative.js';

/**
 * Committed migrations, applied in this order. Each is a class whose name starts with its
 * timestamp; a feature adds its file here and never edits a migration that has shipped.
 */
export const migrationsList = [
  { name: 'Migration20261123000000Foundation', class: Migration20261123000000Foundation },
  { name: 'Migration20261123010000Emails', class: Migration20261123010000Emails },
  { name: 'Migration20261123020000Audience', class: Migration20261123020000Audience },
  { name: 'Migration20261123030000Domains', class: Migration20261123030000Domains },
  { name: 'Migration20261123040000Verification', class: Migration20261123040000Verification },
  { name: 'Migration20261123050000Campaigns', class: Migration20261123050000Campaigns },
  { name: 'Migration20261123060000Outcomes', class: Migration20261123060000Outcomes },
  { name: 'Migration20261123070000EmailEventsCleanup', class: Migration20261123070000EmailEventsCleanup },
  { name: 'Migration20261123080000CampaignTemplates', class: Migration20261123080000CampaignTemplates },
  { name: 'Migration20261125015000EmailsOrganizationTrigger', class: Migration20261125015000EmailsOrganizationTrigger },
  { name: 'Migration20261125050000InboundReports', class: Migration20261125050000InboundReports },
  { name: 'Migration20261125040000Webhooks', class: Migration20261125040000Webhooks },
  { name: 'Migration20261125060000ProviderEvents', class: Migration20261125060000ProviderEvents },
  { name: 'Migration20261125070000Submissions', class: Migration20261125070000Submissions },
  { name: 'Migration20261125080000Users', class: Migration20261125080000Users },
  { name: 'Migration20261125110000EmailBareAddress', class: Migration20261125110000EmailBareAddress },
  { name: 'Migration20261125120000SubscriberConfirmations', class: Migration20261125120000SubscriberConfirmations },
  { name: 'Migration20261125121000CopyRecipientEvents', class: Migration20261125121000CopyRecipientEvents },
  { name: 'Migration20261125220000EmailsRecipientBareAddress', class: Migration20261125220000EmailsRecipientBareAddress },
  { name: 'Migration20261126010000EmailsRecipientAddressIndex', class: Migration20261126010000EmailsRecipientAddressIndex },
  { name: 'Migration20261128150000InboundReportsLz4', class: Migration20261128150000InboundReportsLz4 },
  { name: 'Migration20261208020000AttachmentAlternative', class: Migration20261208020000AttachmentAlternative },
];

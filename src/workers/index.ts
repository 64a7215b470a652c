import { campaignEmailsProcessor, campaignsProcessor } from './campaigns.js';
import { domainsProcessor } from './domains.js';
import { emailsProcessor } from './emails.js';
import { inboundProcessor } from './inbound.js';
import { maintenanceProcessor } from './maintenance.js';
import type { QueueProcessor } from './runner.js';
import { subscribersProcessor } from './subscribers.js';
import { webhooksProcessor } from './webhooks.js';
import { workflowsProcessor } from './workflows.js';

/** Every queue consumer of the service; each feature appends its own. */
export const processors: QueueProcessor[] = [
  maintenanceProcessor as QueueProcessor,
  domainsProcessor as QueueProcessor,
  subscribersProcessor as QueueProcessor,
  workflowsProcessor as QueueProcessor,
  emailsProcessor as QueueProcessor,
  campaignsProcessor as QueueProcessor,
  campaignEmailsProcessor as QueueProcessor,
  inboundProcessor as QueueProcessor,
  webhooksProcessor as QueueProcessor,
];

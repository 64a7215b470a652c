import { emailsProcessor } from './emails.js';
import { maintenanceProcessor } from './maintenance.js';
import type { QueueProcessor } from './runner.js';

/** Every queue consumer of the service; each feature appends its own. */
export const processors: QueueProcessor[] = [maintenanceProcessor as QueueProcessor, emailsProcessor as QueueProcessor];

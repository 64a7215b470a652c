import type { App } from '../types.js';
import { campaignsRoutes } from './campaigns.js';
import { domainsRoutes } from './domains.js';
import { eventsRoutes } from './events.js';
import { subscribersRoutes } from './subscribers.js';
import { tagsRoutes } from './tags.js';
import { emailsRoutes } from './emails.js';
import { tokensRoutes } from './tokens.js';
import { verificationRoutes } from './verification.js';
import { webhooksRoutes } from './webhooks.js';

/** The authenticated /api/v2 modules; each feature appends its own, one a line. */
export const v2Routes: Array<(app: App) => Promise<void>> = [
  tokensRoutes,
  domainsRoutes,
  subscribersRoutes,
  tagsRoutes,
  eventsRoutes,
  verificationRoutes,
  emailsRoutes,
  campaignsRoutes,
  webhooksRoutes,
];

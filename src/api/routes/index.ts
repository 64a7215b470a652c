import type { App } from '../types.js';
import { emailsRoutes } from './emails.js';
import { tokensRoutes } from './tokens.js';

/** The authenticated /api/v2 modules; each feature appends its own. */
export const v2Routes: Array<(app: App) => Promise<void>> = [tokensRoutes, emailsRoutes];

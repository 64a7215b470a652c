import { Migration20261123000000Foundation } from './20261123000000-foundation.js';
import { Migration20261123010000Emails } from './20261123010000-emails.js';

/**
 * Committed migrations, applied in this order. Each is a class whose name starts with its
 * timestamp; a feature adds its file here and never edits a migration that has shipped.
 */
export const migrationsList = [
  { name: 'Migration20261123000000Foundation', class: Migration20261123000000Foundation },
  { name: 'Migration20261123010000Emails', class: Migration20261123010000Emails },
];

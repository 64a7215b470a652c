import type { EntityManager } from '@mikro-orm/postgresql';
import { addCampaignEngagement } from './queries.js';

export type EngagementKind = 'opened' | 'clicked';

/**
 * Bumps a campaign's unique open or click counter (docs/campaigns.md "API decisions"
 * `emailsOpenedCount`, `emailsClickedCount`). Called once per email and kind, in the transaction
 * that set the email's first open/click, so each email counts once however often it is opened.
 */
export async function recordCampaignEngagement(em: EntityManager, campaignId: string, kind: EngagementKind, count = 1): Promise<void> {
  await addCampaignEngagement(em, campaignId, kind, count);
}

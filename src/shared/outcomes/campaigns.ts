import type { EntityManager } from '@mikro-orm/postgresql';

export type EngagementKind = 'opened' | 'clicked';

// Whether the `campaigns` table exists, asked once per database connection pool (process).
const hasCampaigns = new WeakMap<object, Promise<boolean>>();

/**
 * Bumps a campaign's unique open or click counter (spec 2.5 `emailsOpenedCount`,
 * `emailsClickedCount`). Called once per email and kind, in the transaction that set the
 * email's first open/click. The campaigns feature is built on another branch: until its
 * table exists this does nothing (the lead simplifies it after merging).
 */
export async function recordCampaignEngagement(em: EntityManager, campaignId: string, kind: EngagementKind, count = 1): Promise<void> {
  const driver = em.getDriver();
  let present = hasCampaigns.get(driver);
  if (!present) {
    present = em
      .execute<{ present: boolean }[]>(`select to_regclass('campaigns') is not null as present`, [], 'all')
      .then((rows) => rows[0]?.present === true);
    present.catch(() => hasCampaigns.delete(driver));
    hasCampaigns.set(driver, present);
  }
  if (!(await present)) return;
  const column = kind === 'opened' ? 'emails_opened_count' : 'emails_clicked_count';
  await em.execute(`update campaigns set ${column} = ${column} + ? where id = ?`, [count, campaignId], 'run');
}

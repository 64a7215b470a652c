import type { CampaignStatus } from '../db/entities/campaign.js';
import { ValidationError } from '../errors.js';

/**
 * The campaign state machine (docs/campaigns.md), in one place. Every status write goes
 * through `assertTransition`; the SQL that moves a status also checks the old status, so two
 * processes never both make the same move.
 *
 * DRAFT -> SCHEDULED   send (now or at scheduledAt)
 * SCHEDULED -> SENDING the fan-out worker starts it (sendAt set)
 * SENDING -> SENT      fan-out done and every email handed over or failed
 * SENDING -> FAILED    fan-out done and no email could be handed over
 * DRAFT/SENT/FAILED -> ARCHIVED (kept for completeness; no endpoint archives yet)
 * Deleting removes the row from any state (and cancels or stops the send).
 */
export const CAMPAIGN_TRANSITIONS: Readonly<Record<CampaignStatus, readonly CampaignStatus[]>> = {
  DRAFT: ['SCHEDULED', 'ARCHIVED'],
  SCHEDULED: ['SENDING'],
  SENDING: ['SENT', 'FAILED'],
  SENT: ['ARCHIVED'],
  FAILED: ['ARCHIVED'],
  ARCHIVED: [],
};

export function canTransition(from: CampaignStatus, to: CampaignStatus): boolean {
  return CAMPAIGN_TRANSITIONS[from].includes(to);
}

/** Throws a validation error (400 on send, 422 elsewhere) naming the status. */
export function assertTransition(from: CampaignStatus, to: CampaignStatus, statusCode: 400 | 422 = 422): void {
  if (!canTransition(from, to)) {
    throw new ValidationError(`The campaign is ${from}; it cannot become ${to}`, [{ path: 'status', message: `is ${from}` }], statusCode);
  }
}

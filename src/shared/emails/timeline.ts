import type { EntityManager } from '@mikro-orm/postgresql';
import type { Email } from '../db/entities/email.js';
import { emailEvents } from './queries.js';

export interface TimelineEntry {
  at: Date;
  type: 'queued' | 'sent' | 'failed' | 'delivered' | 'bounced' | 'complained' | 'open' | 'click';
  detail: string | null;
}

// An email opened a thousand times shows its first hits; the counts are on the email.
const MAX_EVENTS = 200;

/** What happened to one email, oldest first: its own milestones, then its recorded events. */
export async function emailTimeline(em: EntityManager, email: Email): Promise<TimelineEntry[]> {
  const entries: TimelineEntry[] = [{ at: email.createdAt, type: 'queued', detail: null }];
  if (email.sentAt) entries.push({ at: email.sentAt, type: 'sent', detail: email.messageId });
  if (email.status === 'failed') entries.push({ at: email.updatedAt, type: 'failed', detail: email.failureReason });
  const events = await emailEvents(em, email, MAX_EVENTS);
  for (const e of events) {
    const diagnostic = typeof e.details?.diagnostic === 'string' ? e.details.diagnostic : null;
    entries.push({ at: new Date(e.occurred_at), type: e.type, detail: e.url ?? diagnostic });
  }
  // A transport that is the final destination (MAIL_TRANSPORT=file) reports delivery as it
  // writes, with no event row: the timeline shows it too, at the send.
  if (email.deliveryStatus === 'delivered' && email.sentAt && !events.some((e) => e.type === 'delivered')) {
    entries.push({ at: email.sentAt, type: 'delivered', detail: 'reported by the transport when it took the message' });
  }
  return entries.sort((a, b) => a.at.getTime() - b.at.getTime());
}

import type { Services } from '../container.js';
import { addTracking } from './tracking-html.js';

/** The bare, lower-cased address of `emails.to_address` (`addr` or `Name <addr>`), in SQL. */
export const TO_ADDRESS_SQL = `lower(trim(coalesce(substring(e.to_address from '<([^<>]+)>\\s*$'), e.to_address)))`;

/** In SQL, of an email `e`: its recipient is on its organization's suppression list. */
export const SUPPRESSED_SQL = `exists (select 1 from suppressions s where s.organization_id = e.organization_id and s.address = ${TO_ADDRESS_SQL})`;

/** An organization's `trackOpens` / `trackClicks`, as read with the email's claim. */
export interface TrackingSettings {
  trackOpens: boolean;
  trackClicks: boolean;
}

/**
 * The outcomes' part of the send path, applied where an email is claimed and handed over
 * (emails/deliver.ts): the claim, one batched statement for the jobs running at once, fails
 * a queued email whose recipient is suppressed in its organization instead of claiming it
 * (SUPPRESSED_SQL, so it is never sent) and reads the organization's tracking settings; the
 * gate counts the suppressed ones and turns the settings into the HTML handed over.
 */
export class SendGate {
  constructor(private readonly options: { publicUrl: string; signer: Services['signer']; onSuppressed?: () => void }) {}

  /** An email was failed because its recipient is suppressed. */
  suppressed(): void {
    this.options.onSuppressed?.();
  }

  /** What the rendered HTML of an email goes through before it is handed over (not stored). */
  decorator(emailId: string, settings: TrackingSettings): ((html: string) => string) | undefined {
    const { trackOpens, trackClicks } = settings;
    if (!trackOpens && !trackClicks) return undefined;
    const { publicUrl, signer } = this.options;
    return (html) => addTracking(html, { emailId, trackOpens, trackClicks, publicUrl, signer });
  }
}

const gates = new WeakMap<Services, SendGate>();

/** One gate per process's services. */
export function sendGateOf(services: Services): SendGate {
  let gate = gates.get(services);
  if (!gate) {
    gate = new SendGate({
      publicUrl: services.config.publicUrl,
      signer: services.signer,
      onSuppressed: () => services.metrics.emailsFailed.inc({ reason: 'suppressed' }),
    });
    gates.set(services, gate);
  }
  return gate;
}

import type { Services } from '../container.js';
import { addTracking } from './tracking-html.js';

/** An organization's `trackOpens` / `trackClicks`, as read with the email's claim. */
export interface TrackingSettings {
  trackOpens: boolean;
  trackClicks: boolean;
}

/**
 * The outcomes' part of the send path, applied where an email is claimed and handed over
 * (emails/deliver.ts). The claim (emails/queries.ts, one batched statement for the jobs
 * running at once) fails a queued email whose recipients (`to`, `cc`, `bcc`) are all
 * suppressed in its organization instead of claiming it (so it is never sent), returns the
 * suppressed ones of the others (left out of the SMTP envelope: Postmark's rule,
 * docs/outcomes.md) and reads the organization's tracking settings; the gate counts the
 * suppressed ones and turns the settings into the HTML handed over.
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

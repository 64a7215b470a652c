import type { Services } from '../container.js';
import { addTracking } from './tracking-html.js';

/** A bare, lower-cased address in SQL, from a column or value holding `addr` or `Name <addr>`. */
const bareAddressSql = (value: string) => `lower(trim(coalesce(substring(${value} from '<([^<>]+)>\\s*$'), ${value})))`;

/** The bare, lower-cased address of `emails.to_address`, in SQL. */
export const TO_ADDRESS_SQL = bareAddressSql('e.to_address');

/** In SQL, of an email `e`: its `to` recipient is on its organization's suppression list. */
export const SUPPRESSED_SQL = `exists (select 1 from suppressions s where s.organization_id = e.organization_id and s.address = ${TO_ADDRESS_SQL})`;

/**
 * In SQL, of an email `e` with `cc` or `bcc`: `{ skipped: [bare addresses on the suppression
 * list], live: count of the others }` over its copy recipients. Each address is an index
 * lookup (a left join: an exists() here was planned as a hashed scan of the whole list).
 */
export const COPIES_SQL = `(
  select jsonb_build_object(
    'skipped', coalesce(jsonb_agg(rc.address) filter (where rc.suppressed), '[]'::jsonb),
    'live', count(*) filter (where not rc.suppressed))
  from (select distinct a.address, (cs.address is not null) as suppressed
        from jsonb_array_elements_text(coalesce(e.cc, '[]'::jsonb) || coalesce(e.bcc, '[]'::jsonb)) as x(raw)
        cross join lateral (select ${bareAddressSql('x.raw')} as address) a
        left join suppressions cs on cs.organization_id = e.organization_id and cs.address = a.address) rc)`;

/** In SQL, of an email `e`: every suppressed recipient (`to`, `cc`, `bcc`), a jsonb array. */
export const SKIPPED_RECIPIENTS_SQL = `(
  case when ${SUPPRESSED_SQL} then jsonb_build_array(${TO_ADDRESS_SQL}) else '[]'::jsonb end
  || case when e.cc is null and e.bcc is null then '[]'::jsonb else ${COPIES_SQL} -> 'skipped' end)`;

/** An organization's `trackOpens` / `trackClicks`, as read with the email's claim. */
export interface TrackingSettings {
  trackOpens: boolean;
  trackClicks: boolean;
}

/**
 * The outcomes' part of the send path, applied where an email is claimed and handed over
 * (emails/deliver.ts): the claim, one batched statement for the jobs running at once, fails
 * a queued email whose recipients (`to`, `cc`, `bcc`) are all suppressed in its
 * organization instead of claiming it (so it is never sent), returns the suppressed ones of
 * the others (left out of the SMTP envelope: Postmark's rule, docs/outcomes.md) and reads
 * the organization's tracking settings; the
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

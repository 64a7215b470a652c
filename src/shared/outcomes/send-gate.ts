import type { Services } from '../container.js';
import type { Orm } from '../db/orm.js';
import { Coalescer } from '../emails/coalescer.js';
import { addTracking } from './tracking-html.js';

/** The bare, lower-cased address of `emails.to_address` (`addr` or `Name <addr>`), in SQL. */
export const TO_ADDRESS_SQL = `lower(trim(coalesce(substring(e.to_address from '<([^<>]+)>\\s*$'), e.to_address)))`;

export type GateDecision =
  /** On the organization's suppression list: the row is now failed (reason "suppressed"). */
  | { suppressed: true }
  | { suppressed: false; decorateHtml: (html: string) => string };

interface GateRow {
  id: string;
  track_opens: boolean;
  track_clicks: boolean;
  suppressed: boolean;
}

/**
 * The outcomes' check in the send path, just before an email is claimed and handed over:
 * a queued email whose recipient is suppressed in its organization is failed here (a
 * conditional update, so it is never sent); the others get the organization's tracking
 * settings. The lookups of the jobs running at once are one statement (group commit).
 */
export class SendGate {
  private readonly lookups: Coalescer<string, GateRow | undefined>;

  constructor(
    orm: Orm,
    private readonly options: { publicUrl: string; signer: Services['signer']; onSuppressed?: () => void },
  ) {
    this.lookups = new Coalescer(async (ids) => {
      const rows = await orm.em.fork().execute<GateRow[]>(
        `with ids as (select distinct jsonb_array_elements_text(?::jsonb) as id),
         failed as (
           update emails e set status = 'failed', failure_reason = 'suppressed', updated_at = now()
           from ids
           where e.id = ids.id and e.status = 'queued'
             and exists (select 1 from suppressions s where s.organization_id = e.organization_id and s.address = ${TO_ADDRESS_SQL})
           returning e.id)
         select e.id, o.track_opens, o.track_clicks, (f.id is not null) as suppressed
         from ids join emails e on e.id = ids.id join organizations o on o.id = e.organization_id
         left join failed f on f.id = e.id`,
        [JSON.stringify(ids)],
        'all',
      );
      const byId = new Map(rows.map((r) => [r.id, r]));
      return ids.map((id) => byId.get(id));
    });
  }

  async check(emailId: string): Promise<GateDecision> {
    const row = await this.lookups.submit(emailId);
    if (row?.suppressed) {
      this.options.onSuppressed?.();
      return { suppressed: true };
    }
    const trackOpens = row?.track_opens ?? false;
    const trackClicks = row?.track_clicks ?? false;
    const { publicUrl, signer } = this.options;
    return { suppressed: false, decorateHtml: (html) => addTracking(html, { emailId, trackOpens, trackClicks, publicUrl, signer }) };
  }
}

const gates = new WeakMap<Services, SendGate>();

/** One gate (and its batched lookups) per process's services. */
export function sendGateOf(services: Services): SendGate {
  let gate = gates.get(services);
  if (!gate) {
    gate = new SendGate(services.orm, {
      publicUrl: services.config.publicUrl,
      signer: services.signer,
      onSuppressed: () => services.metrics.emailsFailed.inc({ reason: 'suppressed' }),
    });
    gates.set(services, gate);
  }
  return gate;
}

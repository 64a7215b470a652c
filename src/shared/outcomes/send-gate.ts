import type { Services } from '../container.js';
import type { Orm } from '../db/orm.js';
import { Coalescer } from '../emails/coalescer.js';
import { addTracking } from './tracking-html.js';

/** The bare, lower-cased address of `emails.to_address` (`addr` or `Name <addr>`), in SQL. */
export const TO_ADDRESS_SQL = `lower(trim(coalesce(substring(e.to_address from '<([^<>]+)>\\s*$'), e.to_address)))`;

export type GateDecision =
  /** Every recipient is on the organization's suppression list: the row is now failed (reason "suppressed"). */
  | { suppressed: true }
  | {
      suppressed: false;
      decorateHtml: (html: string) => string;
      /**
       * Bare, lower-cased recipients (`to`, `cc` or `bcc`) on the suppression list: left out
       * of the SMTP envelope, so only the others receive the message (docs/outcomes.md).
       */
      skipRecipients: string[];
    };

interface GateRow {
  id: string;
  track_opens: boolean;
  track_clicks: boolean;
  suppressed: boolean;
  skip: string[] | null;
}

/** A bare, lower-cased address in SQL, from a column or value holding `addr` or `Name <addr>`. */
const bareAddressSql = (value: string) => `lower(trim(coalesce(substring(${value} from '<([^<>]+)>\\s*$'), ${value})))`;

/**
 * The outcomes' check in the send path, just before an email is claimed and handed over,
 * against the organization's suppression list (hard bounces and complaints), over every
 * recipient: `to`, `cc` and `bcc`. As Postmark does, suppressed recipients are dropped and
 * the message goes to the others; a queued email whose recipients are all suppressed is
 * failed here (a conditional update, so it is never sent). The others also get the
 * organization's tracking settings. The lookups of the jobs running at once are one
 * statement (group commit); an email without cc or bcc checks its `to` only.
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
         recipients as (
           select e.id, e.organization_id, e.status,
             case when s.address is null then null else ${TO_ADDRESS_SQL} end as to_skipped,
             case when e.cc is null and e.bcc is null then null else (
               select jsonb_build_object(
                 'skipped', coalesce(jsonb_agg(c.address) filter (where c.suppressed), '[]'::jsonb),
                 'live', count(*) filter (where not c.suppressed))
               from (select distinct a.address, (cs.address is not null) as suppressed
                     from jsonb_array_elements_text(coalesce(e.cc, '[]'::jsonb) || coalesce(e.bcc, '[]'::jsonb)) as x(raw)
                     cross join lateral (select ${bareAddressSql('x.raw')} as address) a
                     left join suppressions cs on cs.organization_id = e.organization_id and cs.address = a.address) c
             ) end as copies
           from ids join emails e on e.id = ids.id
           left join suppressions s on s.organization_id = e.organization_id and s.address = ${TO_ADDRESS_SQL}),
         failed as (
           update emails e set status = 'failed', failure_reason = 'suppressed', updated_at = now()
           from recipients r
           where e.id = r.id and e.status = 'queued' and r.to_skipped is not null
             and coalesce((r.copies ->> 'live')::int, 0) = 0
           returning e.id)
         select r.id, o.track_opens, o.track_clicks, (f.id is not null) as suppressed,
           case when r.to_skipped is null then r.copies -> 'skipped'
             else jsonb_build_array(r.to_skipped) || coalesce(r.copies -> 'skipped', '[]'::jsonb) end as skip
         from recipients r join organizations o on o.id = r.organization_id
         left join failed f on f.id = r.id`,
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
    return {
      suppressed: false,
      decorateHtml: (html) => addTracking(html, { emailId, trackOpens, trackClicks, publicUrl, signer }),
      skipRecipients: row?.skip ?? [],
    };
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

import { z } from 'zod';

/**
 * The change events a subscriber write puts on the `workflows` queue when the caller passes
 * `triggerWorkflows: true` (docs/audience.md "Workflows"): one job per change, named after the
 * event, with the event id as job id. Automations will consume them; today the workflows worker
 * records each one on the subscriber's activity (subscriber_events).
 */
export const WORKFLOW_EVENTS = [
  'subscriber.created',
  'subscriber.subscribed',
  'subscriber.unsubscribed',
  'subscriber.updated',
  'subscriber.tag_added',
  'subscriber.tag_removed',
  'subscriber.field_updated',
] as const;
export type WorkflowEventName = (typeof WORKFLOW_EVENTS)[number];

export const WorkflowEventPayload = z.object({
  eventId: z.string(),
  organizationId: z.string(),
  subscriberId: z.string(),
  occurredAt: z.string(),
  /** What changed: `{ status }`, `{ tag: { id, name } }`, `{ field, value }` or `{ changed: [...] }`. */
  data: z.record(z.string(), z.unknown()),
});
export type WorkflowEventPayload = z.infer<typeof WorkflowEventPayload>;

export interface WorkflowEvent {
  name: WorkflowEventName;
  data: Record<string, unknown>;
}

export const workflowJobs = Object.fromEntries(WORKFLOW_EVENTS.map((name) => [name, WorkflowEventPayload])) as Record<
  WorkflowEventName,
  typeof WorkflowEventPayload
>;

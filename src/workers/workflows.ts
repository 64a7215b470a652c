import { recordActivity } from '../shared/subscribers/events.js';
import { WORKFLOW_EVENTS, type WorkflowEventName, type WorkflowEventPayload } from '../shared/subscribers/workflow-events.js';
import { defineProcessor, type JobContext, type JobHandler } from './runner.js';

/**
 * Subscriber change events (triggerWorkflows). Today each one is recorded on the
 * subscriber's activity (listed by GET /subscribers/{s}/events); automations will hook in
 * here. Idempotent by event id.
 */
async function record(name: WorkflowEventName, payload: WorkflowEventPayload, ctx: JobContext) {
  const recorded = await recordActivity(ctx.em, {
    id: payload.eventId,
    organizationId: payload.organizationId,
    subscriberId: payload.subscriberId,
    eventType: name,
    data: payload.data,
    createdAt: new Date(payload.occurredAt),
  });
  return { recorded };
}

const handlers = Object.fromEntries(
  WORKFLOW_EVENTS.map((name) => [name, (payload: WorkflowEventPayload, ctx: JobContext) => record(name, payload, ctx)]),
) as { [J in WorkflowEventName]: JobHandler<'workflows', J> };

export const workflowsProcessor = defineProcessor({ queue: 'workflows', handlers });

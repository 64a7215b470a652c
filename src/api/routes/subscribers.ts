import { z } from 'zod';
import { SUBSCRIBER_STATUSES } from '../../shared/db/entities/index.js';
import { AppError } from '../../shared/errors.js';
import { listSubscriberEvents } from '../../shared/subscribers/events.js';
import { importRecords } from '../../shared/subscribers/import.js';
import { CountryCode, EmailAddress, FIELDS_MAX, IpAddress, TAGS_MAX } from '../../shared/subscribers/input.js';
import type { SubscriberRecord } from '../../shared/subscribers/rows.js';
import {
  addSubscriberTags,
  createSubscriber,
  getSubscriber,
  listSubscribers,
  patchSubscriber,
  removeSubscriberTags,
  unsubscribeSubscriber,
  type AudienceDeps,
  type WriteResult,
} from '../../shared/subscribers/service.js';
import { iso, limitQuery, list, listEnvelope, Timestamp } from '../schemas.js';
import type { App } from '../types.js';

const NAME_MAX = 255;
const PHONE_MAX = 50;

const TagRefSchema = z.object({ id: z.string(), name: z.string() });
const Status = z.enum(SUBSCRIBER_STATUSES);

const WritableFields = {
  name: z.string().trim().max(NAME_MAX, `must be at most ${NAME_MAX} characters`).nullable().optional(),
  phone: z.string().trim().max(PHONE_MAX, `must be at most ${PHONE_MAX} characters`).nullable().optional(),
  tags: z.array(z.string()).max(TAGS_MAX, `at most ${TAGS_MAX} tags`).optional(),
  fields: z
    .record(z.string(), z.string().nullable())
    .refine((fields) => Object.keys(fields).length <= FIELDS_MAX, `at most ${FIELDS_MAX} fields`)
    .optional()
    .describe('Custom field values; null removes a field'),
  replaceTags: z.boolean().optional(),
  resubscribe: z.boolean().optional(),
  triggerWorkflows: z.boolean().optional(),
  skipDoubleOptIn: z.boolean().optional(),
  ipAddress: IpAddress.optional(),
  country: CountryCode.optional(),
};

/** `GET /subscribers`' query (the `list_subscribers` tool takes the same filters). */
export const ListSubscribersQuery = z.object({
  limit: limitQuery.default(20),
  after: z.string().regex(/^sub_[0-9a-z]{26}$/, 'must be a subscriber id').optional(),
  before: z.string().regex(/^sub_[0-9a-z]{26}$/, 'must be a subscriber id').optional(),
  status: Status.optional(),
  tag: z.string().min(1).max(100).optional(),
  query: z.string().max(254).optional().describe('Substring of the address or the name; empty means no filter'),
});

export const CreateBody = z.object({ email: EmailAddress, ...WritableFields });
export const PatchBody = z.object({ email: EmailAddress.optional(), ...WritableFields });
// A batch of `subscribers import` run with a token: the CSV's records, read by the CLI, parsed
// and imported here in one transaction (docs/audience.md "CSV import").
const IMPORT_RECORDS_MAX = 1_000;
const ImportBody = z.object({
  records: z.array(z.record(z.string(), z.string())).min(1).max(IMPORT_RECORDS_MAX, `at most ${IMPORT_RECORDS_MAX} records a request`),
  resubscribe: z.boolean().optional().describe('Unsubscribed addresses in the file are subscribed again (default true)'),
});
const ImportAnswer = z.object({
  object: z.literal('import'),
  created: z.number(),
  updated: z.number(),
  merged: z.number(),
  skipped: z.array(z.object({ index: z.number(), error: z.string() })),
  warnings: z.array(z.object({ index: z.number(), warning: z.string() })),
});
const TagsBody = z.object({ tags: z.array(z.string()).min(1).max(TAGS_MAX, `at most ${TAGS_MAX} tags`), triggerWorkflows: z.boolean().optional() });
const UnsubscribeBody = z.object({ triggerWorkflows: z.boolean().optional() }).nullish();

/** docs/audience.md "Data": the shape answered by create and patch. */
const WriteShape = z.object({
  id: z.string(),
  email: z.string(),
  name: z.string().nullable(),
  phone: z.string().nullable(),
  status: Status,
  tags: z.array(TagRefSchema),
  fields: z.record(z.string(), z.string()),
  warnings: z.array(z.string()).optional(),
});

/** docs/audience.md "Data" get shape, plus `revenue` (docs/audience.md "Events"). */
const GetShape = z.object({
  id: z.string(),
  email: z.string(),
  name: z.string().nullable(),
  phone: z.string().nullable(),
  status: Status,
  createdAt: Timestamp,
  updatedAt: Timestamp,
  tags: z.array(TagRefSchema),
  fields: z.array(z.object({ name: z.string(), value: z.string() })),
  revenue: z.number().int().describe('Net revenue in integer cents'),
}).meta({ id: 'Subscriber' });

const EventItem = z.object({ id: z.string(), eventType: z.string(), data: z.record(z.string(), z.unknown()), createdAt: Timestamp }).meta({ id: 'SubscriberEvent' });

const SubscriberParams = z.object({ subscriber: z.string().min(1).describe('A subscriber id or an email address') });

function writeShape({ subscriber, warnings }: WriteResult) {
  return {
    id: subscriber.id,
    email: subscriber.email,
    name: subscriber.name,
    phone: subscriber.phone,
    status: subscriber.status,
    tags: subscriber.tags,
    fields: subscriber.fields,
    ...(warnings.length > 0 ? { warnings } : {}),
  };
}

function getShape(subscriber: SubscriberRecord) {
  return {
    id: subscriber.id,
    email: subscriber.email,
    name: subscriber.name,
    phone: subscriber.phone,
    status: subscriber.status,
    createdAt: iso(subscriber.createdAt),
    updatedAt: iso(subscriber.updatedAt),
    tags: subscriber.tags,
    fields: Object.keys(subscriber.fields)
      .sort()
      .map((name) => ({ name, value: subscriber.fields[name] })),
    revenue: subscriber.revenue,
  };
}

export async function subscribersRoutes(app: App): Promise<void> {
  const deps = (em: AudienceDeps['em']): AudienceDeps => ({ em, producer: app.services.producer, clock: app.services.clock });

  app.post(
    '/subscribers',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Create a subscriber or update it by address', body: CreateBody, response: { 200: WriteShape } },
    },
    async (request) => writeShape(await createSubscriber(deps(request.em), request.caller.organizationId, request.body)),
  );

  app.post(
    '/subscribers/import',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Import a batch of CSV records (the CLI\'s subscribers import)', body: ImportBody, response: { 200: ImportAnswer } },
    },
    async (request) => ({
      object: 'import' as const,
      ...(await importRecords(request.em, request.caller.organizationId, request.body.records, { resubscribe: request.body.resubscribe ?? true, now: app.services.clock() })),
    }),
  );

  app.get(
    '/subscribers',
    {
      config: { permission: 'subscribers' },
      schema: {
        tags: ['subscribers'],
        summary: 'List subscribers, newest first',
        querystring: ListSubscribersQuery,
        response: { 200: listEnvelope(GetShape) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listSubscribers(request.em, request.caller.organizationId, request.query);
      return list(items.map(getShape), hasMore);
    },
  );

  app.get(
    '/subscribers/:subscriber',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Get a subscriber by id or address', params: SubscriberParams, response: { 200: GetShape } },
    },
    async (request) => getShape(await getSubscriber(request.em, request.caller.organizationId, request.params.subscriber)),
  );

  app.patch(
    '/subscribers/:subscriber',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Update a subscriber', params: SubscriberParams, body: PatchBody, response: { 200: WriteShape } },
    },
    async (request) =>
      writeShape(await patchSubscriber(deps(request.em), request.caller.organizationId, request.params.subscriber, request.body)),
  );

  app.delete(
    '/subscribers/:subscriber',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Deleting a subscriber is disabled (405)', params: SubscriberParams },
    },
    async (_request, reply) => {
      void reply.header('Allow', 'GET, PATCH');
      throw new AppError(405, 'method_not_allowed', 'Deleting a subscriber is disabled; unsubscribe it with POST /api/v2/subscribers/{subscriber}/unsubscribe');
    },
  );

  app.post(
    '/subscribers/:subscriber/unsubscribe',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Unsubscribe a subscriber', params: SubscriberParams, body: UnsubscribeBody, response: { 200: WriteShape } },
    },
    async (request) =>
      writeShape(await unsubscribeSubscriber(deps(request.em), request.caller.organizationId, request.params.subscriber, request.body ?? {})),
  );

  app.post(
    '/subscribers/:subscriber/tags',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Attach tags to a subscriber', params: SubscriberParams, body: TagsBody, response: { 200: WriteShape } },
    },
    async (request) => writeShape(await addSubscriberTags(deps(request.em), request.caller.organizationId, request.params.subscriber, request.body)),
  );

  app.delete(
    '/subscribers/:subscriber/tags',
    {
      config: { permission: 'subscribers' },
      schema: { tags: ['subscribers'], summary: 'Detach tags from a subscriber', params: SubscriberParams, body: TagsBody, response: { 200: WriteShape } },
    },
    async (request) =>
      writeShape(await removeSubscriberTags(deps(request.em), request.caller.organizationId, request.params.subscriber, request.body)),
  );

  app.get(
    '/subscribers/:subscriber/events',
    {
      config: { permission: 'subscribers' },
      schema: {
        tags: ['subscribers'],
        summary: 'List the events of a subscriber, newest first',
        params: SubscriberParams,
        querystring: z.object({
          limit: limitQuery.default(20),
          after: z.string().regex(/^evt_[0-9a-z]{26}$/, 'must be an event id').optional(),
          before: z.string().regex(/^evt_[0-9a-z]{26}$/, 'must be an event id').optional(),
        }),
        response: { 200: listEnvelope(EventItem) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listSubscriberEvents(request.em, request.caller.organizationId, request.params.subscriber, request.query);
      return list(
        items.map((e) => ({ ...e, createdAt: iso(e.createdAt) })),
        hasMore,
      );
    },
  );
}

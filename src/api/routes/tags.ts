import { z } from 'zod';
import { TagName } from '../../shared/subscribers/input.js';
import { createTag, getTag, listTags, renameTag } from '../../shared/subscribers/tags.js';
import { list, listEnvelope } from '../schemas.js';
import type { App } from '../types.js';

const TagShape = z.object({ id: z.string(), name: z.string() }).meta({ id: 'Tag' });
const TagParams = z.object({ tag: z.string().min(1).describe('A tag id or its current name') });
// docs/audience.md "Workflows": tag writes accept `triggerWorkflows`. Creating or renaming a tag changes no
// subscriber, so it fires nothing (docs/audience.md "Workflows").
const TagBody = z.object({ name: TagName, triggerWorkflows: z.boolean().optional().describe('Accepted as on every tag write; no subscriber changes here, so no workflow fires') });

/** docs/audience.md: permission `audience`. */
export async function tagsRoutes(app: App): Promise<void> {
  app.get(
    '/tags',
    {
      config: { permission: 'audience' },
      schema: { tags: ['tags'], summary: 'List tags by name', response: { 200: listEnvelope(TagShape) } },
    },
    async (request) => list(await listTags(request.em, request.caller.organizationId), false),
  );

  app.post(
    '/tags',
    {
      config: { permission: 'audience' },
      schema: { tags: ['tags'], summary: 'Create a tag', body: TagBody, response: { 200: TagShape } },
    },
    async (request) => createTag(request.em, request.caller.organizationId, request.body.name, app.services.clock()),
  );

  app.get(
    '/tags/:tag',
    {
      config: { permission: 'audience' },
      schema: { tags: ['tags'], summary: 'Get a tag by id or name', params: TagParams, response: { 200: TagShape } },
    },
    async (request) => getTag(request.em, request.caller.organizationId, request.params.tag),
  );

  app.patch(
    '/tags/:tag',
    {
      config: { permission: 'audience' },
      schema: { tags: ['tags'], summary: 'Rename a tag', params: TagParams, body: TagBody, response: { 200: TagShape } },
    },
    async (request) => renameTag(request.em, request.caller.organizationId, request.params.tag, request.body.name, app.services.clock()),
  );
}

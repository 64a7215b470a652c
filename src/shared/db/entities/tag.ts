import { EntitySchema } from '@mikro-orm/core';

/** An audience tag; names are unique per organization regardless of case. */
export class Tag {
  id!: string;
  organizationId!: string;
  name!: string;
  createdAt: Date = new Date();
  updatedAt: Date = new Date();
}

export const TagSchema = new EntitySchema<Tag>({
  class: Tag,
  tableName: 'tags',
  properties: {
    id: { type: 'string', primary: true },
    organizationId: { type: 'string' },
    name: { type: 'string' },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
    updatedAt: { type: 'Date', columnType: 'timestamptz(3)', onUpdate: () => new Date() },
  },
});

/** Which tags a subscriber has. */
export class SubscriberTag {
  subscriberId!: string;
  tagId!: string;
  createdAt: Date = new Date();
}

export const SubscriberTagSchema = new EntitySchema<SubscriberTag>({
  class: SubscriberTag,
  tableName: 'subscriber_tags',
  properties: {
    subscriberId: { type: 'string', primary: true },
    tagId: { type: 'string', primary: true },
    createdAt: { type: 'Date', columnType: 'timestamptz(3)' },
  },
});

import { z } from 'zod';
import type { Domain, Sender } from '../../shared/db/entities/index.js';
import { announceDomainChange } from '../../shared/domains/dkim.js';
import { createSender, getSender, listSenders } from '../../shared/domains/senders.js';
import {
  createDomain,
  deleteDomain,
  findDomain,
  listDomains,
  mailHostOf,
  verifyDomain,
} from '../../shared/domains/service.js';
import { iso, limitQuery, list, listEnvelope, Timestamp } from '../schemas.js';
import { hasControlCharacter, hasLineBreak } from '../../shared/emails/addresses.js';
import type { App } from '../types.js';

const Status = z.enum(['NOT_STARTED', 'PENDING', 'VERIFIED', 'FAILED']);

const DnsRecord = z.object({
  type: z.enum(['TXT', 'MX']),
  name: z.string().describe('Fully qualified name'),
  value: z.string(),
  priority: z.number().int().nullable(),
  ttl: z.number().int(),
  purpose: z.enum(['dkim', 'spf', 'dmarc', 'return_path']),
  status: Status,
}).meta({ id: 'DnsRecord' });

const DomainGet = z.object({
  id: z.string(),
  domain: z.string(),
  status: Status,
  region: z.string(),
  createdAt: Timestamp,
  mailProviderRecords: z.array(z.unknown()),
  dnsRecords: z.array(DnsRecord),
  message: z.string().optional().describe('Present while verification is incomplete'),
}).meta({ id: 'Domain' });

const DomainListItem = z.object({
  id: z.string(),
  domain: z.string(),
  status: Status,
  region: z.string(),
  createdAt: Timestamp,
  emailSendersCount: z.number().int(),
}).meta({ id: 'DomainListItem' });

export const CreateDomainBody = z.object({
  // 253 characters in all (RFC 1035), the root's trailing dot aside (`example.com.`).
  domain: z
    .string()
    .min(1)
    .max(254, { message: 'must be at most 253 characters', abort: true })
    .refine((value) => value.replace(/\.$/, '').length <= 253, 'must be at most 253 characters'),
  region: z
    .string()
    .regex(/^[a-z0-9-]{1,32}$/, 'lower-case letters, digits and -, at most 32')
    .optional(),
});

const DomainParams = z.object({ domain: z.string().min(1).max(300) });

const SenderShape = z.object({
  id: z.string(),
  name: z.string(),
  email: z.string(),
  domainId: z.string(),
  createdAt: Timestamp,
}).meta({ id: 'Sender' });

export const CreateSenderBody = z.object({
  name: z
    .string()
    .trim()
    .min(1, 'must be 1 to 100 characters')
    .max(100, 'must be 1 to 100 characters')
    .refine((name) => !hasLineBreak(name), 'must be one line (no line break)')
    .refine((name) => hasLineBreak(name) || !hasControlCharacter(name), 'must not contain control characters'),
  email: z.string().trim().max(320),
});

function presentDomain(domain: Domain): z.infer<typeof DomainGet> {
  return {
    id: domain.id,
    domain: domain.domain,
    status: domain.status,
    region: domain.region,
    createdAt: iso(domain.createdAt),
    mailProviderRecords: domain.mailProviderRecords ?? [],
    dnsRecords: domain.dnsRecords,
    ...(domain.status !== 'VERIFIED' && domain.message ? { message: domain.message } : {}),
  };
}

function presentSender(sender: Sender): z.infer<typeof SenderShape> {
  return { id: sender.id, name: sender.name, email: sender.email, domainId: sender.domainId, createdAt: iso(sender.createdAt) };
}

export async function domainsRoutes(app: App): Promise<void> {
  const mailHost = mailHostOf(app.services.config.publicUrl);

  app.post(
    '/domains',
    {
      config: { permission: 'domains' },
      schema: { tags: ['domains'], summary: 'Add a sending domain', body: CreateDomainBody, response: { 200: DomainGet } },
    },
    async (request) => {
      const domain = await createDomain(
        request.em,
        app.services.box,
        request.caller.organizationId,
        mailHost,
        request.body,
        app.services.clock(),
        app.services.config.maxDomainsPerOrganization,
      );
      // Sending processes that cached "no such domain" sign its mail from now on.
      await announceDomainChange(app.services, request.caller.organizationId);
      return presentDomain(domain);
    },
  );

  app.get(
    '/domains',
    {
      config: { permission: 'domains' },
      schema: {
        tags: ['domains'],
        summary: 'List sending domains',
        querystring: z.object({ limit: limitQuery.optional() }),
        response: { 200: listEnvelope(DomainListItem) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listDomains(request.em, request.caller.organizationId, request.query.limit);
      return list(
        items.map(({ domain, emailSendersCount }) => ({
          id: domain.id,
          domain: domain.domain,
          status: domain.status,
          region: domain.region,
          createdAt: iso(domain.createdAt),
          emailSendersCount,
        })),
        hasMore,
      );
    },
  );

  app.get(
    '/domains/:domain',
    {
      config: { permission: 'domains' },
      schema: { tags: ['domains'], summary: 'Get a sending domain by id or hostname', params: DomainParams, response: { 200: DomainGet } },
    },
    async (request) => presentDomain(await findDomain(request.em, request.caller.organizationId, request.params.domain)),
  );

  app.post(
    '/domains/:domain/verify',
    {
      config: { permission: 'domains' },
      schema: {
        tags: ['domains'],
        summary: 'Start (or repeat) the DNS verification of a domain',
        params: DomainParams,
        response: { 200: DomainGet },
      },
    },
    async (request) => {
      const now = app.services.clock();
      const domain = await verifyDomain(request.em, app.services.producer, request.caller.organizationId, request.params.domain, now);
      return presentDomain(domain);
    },
  );

  app.delete(
    '/domains/:domain',
    {
      config: { permission: 'domains' },
      schema: {
        tags: ['domains'],
        summary: 'Delete a sending domain (and its senders)',
        params: DomainParams,
        response: { 200: z.object({ object: z.literal('domain'), id: z.string(), deleted: z.literal(true) }) },
      },
    },
    async (request) => {
      const domain = await deleteDomain(request.em, request.caller.organizationId, request.params.domain);
      // Sending processes stop signing with its key now, not when their cache expires.
      await announceDomainChange(app.services, request.caller.organizationId);
      return { object: 'domain' as const, id: domain.id, deleted: true as const };
    },
  );

  app.post(
    '/senders',
    {
      config: { permission: 'domains' },
      schema: { tags: ['senders'], summary: 'Add a sender on one of the domains', body: CreateSenderBody, response: { 200: SenderShape } },
    },
    async (request) => presentSender(await createSender(request.em, request.caller.organizationId, request.body, app.services.clock())),
  );

  app.get(
    '/senders',
    {
      config: { permission: 'domains' },
      schema: {
        tags: ['senders'],
        summary: 'List senders',
        querystring: z.object({ limit: limitQuery.optional() }),
        response: { 200: listEnvelope(SenderShape) },
      },
    },
    async (request) => {
      const { items, hasMore } = await listSenders(request.em, request.caller.organizationId, request.query.limit);
      return list(items.map(presentSender), hasMore);
    },
  );

  app.get(
    '/senders/:id',
    {
      config: { permission: 'domains' },
      schema: { tags: ['senders'], summary: 'Get a sender', params: z.object({ id: z.string().min(1).max(100) }), response: { 200: SenderShape } },
    },
    async (request) => presentSender(await getSender(request.em, request.caller.organizationId, request.params.id)),
  );
}

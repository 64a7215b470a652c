import { parseFragment, type DefaultTreeAdapterMap } from 'parse5';
import type { CampaignContentType } from '../db/entities/campaign.js';
import { assertContentSize, ContentTooDeepError, laidOut, markdownToHtml, nestedTooDeep, renderChecked } from '../emails/render.js';
import { JSON_TOO_DEEP, jsonNestedDeeperThan } from '../json-depth.js';
import { unstorableInJsonText } from '../storable.js';
import { UNSUBSCRIBE_TARGET } from './html.js';
import { mailyHasUnsubscribeLink, mailyProblem, mailyToHtml } from './maily.js';
import { plateHasUnsubscribeLink, plateProblem, plateToHtml } from './plate.js';

/**
 * Campaign content by type (docs/campaigns.md "Content formats"): validation, the unsubscribe-link
 * check and the rendering of a campaign ONCE into an HTML and a text template that still hold the
 * `{{...}}` placeholders; `personalize.ts` fills them per recipient.
 */

/** Parses a JSON string for MAILY/PLATE; returns the value to store, or a problem. */
export function normalizeContent(contentType: CampaignContentType, content: unknown): { value: unknown } | { problem: string } {
  if (content === null || content === undefined) return { value: null };
  if (contentType === 'MARKDOWN') {
    if (typeof content !== 'string') return { problem: 'must be a markdown string for contentType MARKDOWN' };
    return { value: content };
  }
  let value = content;
  if (typeof value === 'string') {
    if (jsonNestedDeeperThan(value)) return { problem: JSON_TOO_DEEP };
    try {
      value = JSON.parse(value);
    } catch {
      return { problem: `is not valid JSON (contentType ${contentType})` };
    }
    const unstorable = unstorableInJsonText(value);
    if (unstorable) return { problem: unstorable };
  }
  const problem = contentType === 'MAILY' ? mailyProblem(value) : plateProblem(value);
  return problem ? { problem } : { value };
}

type Node = DefaultTreeAdapterMap['node'];

function markdownHasUnsubscribeLink(markdown: string): boolean {
  // The HTML the reader gets (a Markdown link, or HTML written in the Markdown), as a whole:
  // HTML tokens on their own would lose what encloses them (a template, a textarea).
  return htmlHasUnsubscribeLink(markdownToHtml(markdown));
}

/**
 * Whether HTML holds an `<a>` the reader can click whose target is `{{unsubscribe_url}}`:
 * parsed (parse5), so one in a comment, in a `<textarea>` or `<template>`, or a
 * `<link href>`, is no link.
 */
function htmlHasUnsubscribeLink(html: string): boolean {
  if (!/unsubscribe_url/i.test(html)) return false;
  // parse5 is not linear in the nesting (20,000 nested divs took seconds): refused first.
  if (nestedTooDeep(html)) throw new ContentTooDeepError();
  const stack: Node[] = [parseFragment(html)];
  while (stack.length > 0) {
    const node = stack.pop()!;
    if ('tagName' in node && node.tagName === 'a' && node.attrs.some((a) => a.name === 'href' && UNSUBSCRIBE_TARGET.test(a.value))) return true;
    // A template's content is not shown; childNodes of other elements are.
    if ('childNodes' in node) stack.push(...node.childNodes);
  }
  return false;
}

/** True when `{{unsubscribe_url}}` is the target of a link (not merely in the text). */
export function hasUnsubscribeLink(contentType: CampaignContentType, content: unknown): boolean {
  if (content === null || content === undefined) return false;
  if (contentType === 'MARKDOWN') return typeof content === 'string' && markdownHasUnsubscribeLink(content);
  if (contentType === 'MAILY') return mailyHasUnsubscribeLink(content);
  return plateHasUnsubscribeLink(content);
}

export function contentBodyHtml(contentType: CampaignContentType, content: unknown): string {
  if (content === null || content === undefined) return '';
  if (contentType === 'MARKDOWN') return markdownToHtml(String(content));
  if (contentType === 'MAILY') return mailyToHtml(content);
  return plateToHtml(content);
}

export interface CampaignTemplate {
  subject: string;
  html: string;
  text: string;
}

/** The whole message with placeholders left in: rendered once per campaign. */
export function renderCampaignTemplate(campaign: { contentType: CampaignContentType; content: unknown; subject: string; preview: string | null }): CampaignTemplate {
  // The source is what is capped: its HTML may be longer (escaped characters, the layout).
  assertContentSize(typeof campaign.content === 'string' ? campaign.content : JSON.stringify(campaign.content ?? null));
  const body = contentBodyHtml(campaign.contentType, campaign.content);
  const html = laidOut(body, campaign.subject, campaign.preview);
  const rendered = renderChecked({ contentKind: 'html', content: html, subject: campaign.subject });
  return { subject: campaign.subject, html: rendered.html, text: rendered.text };
}

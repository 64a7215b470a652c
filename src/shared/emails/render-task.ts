import { renderCampaignTemplate, type CampaignTemplate } from '../campaigns/content.js';
import type { CampaignContentType } from '../db/entities/campaign.js';
import { renderEmail, type RenderInput, type Rendered } from './render.js';

/** What a render thread is asked: the same functions the workers run in their own process. */
export type RenderTask =
  | { kind: 'email'; input: RenderInput }
  | { kind: 'campaign'; campaign: { contentType: CampaignContentType; content: unknown; subject: string; preview: string | null } };

export type RenderAnswer = { ok: true; value: Rendered | CampaignTemplate } | { ok: false; name: string; message: string };

export function runRenderTask(task: RenderTask): RenderAnswer {
  try {
    return { ok: true, value: task.kind === 'email' ? renderEmail(task.input) : renderCampaignTemplate(task.campaign) };
  } catch (error) {
    // Errors cross the thread boundary as plain data: the pool rebuilds the class by name.
    const e = error as Error;
    return { ok: false, name: e.name, message: e.message };
  }
}

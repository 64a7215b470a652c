import type { SendMailOptions } from 'nodemailer';
import type { CampaignTemplate } from '../campaigns/content.js';
import type { CampaignContentType } from '../db/entities/campaign.js';
import type { Composed } from './compose.js';
import type { RenderInput, Rendered } from './render.js';

/** What a render thread is asked: the same functions the workers run in their own process. */
export type RenderTask =
  | { kind: 'email'; input: RenderInput }
  | { kind: 'campaign'; campaign: { contentType: CampaignContentType; content: unknown; subject: string; preview: string | null } }
  | { kind: 'compose'; mail: SendMailOptions }
  | { kind: 'unsubscribe-link'; contentType: CampaignContentType; content: unknown };

export type RenderAnswer = { ok: true; value: Rendered | CampaignTemplate | Composed | boolean } | { ok: false; name: string; message: string };

// Each kind's module is loaded by the first task of that kind: a thread that only builds
// messages (a worker sending a campaign) does not hold the rendering libraries (about 40 MiB).
async function run(task: RenderTask): Promise<Rendered | CampaignTemplate | Composed | boolean> {
  if (task.kind === 'email') return (await import('./render.js')).renderEmail(task.input);
  if (task.kind === 'campaign') return (await import('../campaigns/content.js')).renderCampaignTemplate(task.campaign);
  if (task.kind === 'unsubscribe-link') return (await import('../campaigns/content.js')).hasUnsubscribeLink(task.contentType, task.content);
  return (await import('./compose.js')).composeMessage(task.mail);
}

export async function runRenderTask(task: RenderTask): Promise<RenderAnswer> {
  try {
    return { ok: true, value: await run(task) };
  } catch (error) {
    // Errors cross the thread boundary as plain data: the pool rebuilds the class by name.
    const e = error as Error;
    return { ok: false, name: e.name, message: e.message };
  }
}

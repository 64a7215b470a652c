import { parentPort } from 'node:worker_threads';
import type { RenderAnswer, RenderTask } from './render-task.js';
import { runRenderTask } from './render-task.js';

// The body of a render thread (render-pool.ts): compiled to dist/ with the rest of src/, so
// the production build needs nothing but node. Under tsx (tests, development) the thread
// starts through render-worker.mjs, which registers tsx first and then imports this file.
// Tasks may come before the last one is answered (a delivery thread takes many at once);
// each is answered by its id when done.
const port = parentPort;
if (!port) throw new Error('render-thread runs only as a worker thread');
port.on('message', ({ id, task }: { id: number; task: RenderTask }) => {
  void runRenderTask(task).then((answer) => port.postMessage({ id, answer }, transferable(answer)));
});

/**
 * A built message's bytes are moved to the caller, not copied, when they fill their own
 * memory (a Buffer of less than 4 KiB is a slice of Node's shared pool, and is copied): one
 * copy of each message in the process, not one in each thread awaiting collection.
 */
function transferable(answer: RenderAnswer): ArrayBuffer[] {
  if (!answer.ok || typeof answer.value !== 'object' || !('raw' in answer.value)) return [];
  const { raw } = answer.value;
  return raw.byteOffset === 0 && raw.byteLength === raw.buffer.byteLength && raw.buffer instanceof ArrayBuffer ? [raw.buffer] : [];
}
port.postMessage({ ready: true });

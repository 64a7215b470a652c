import { parentPort } from 'node:worker_threads';
import type { RenderTask } from './render-task.js';
import { runRenderTask } from './render-task.js';

// The body of a render thread (render-pool.ts): compiled to dist/ with the rest of src/, so
// the production build needs nothing but node. Under tsx (tests, development) the thread
// starts through render-worker.mjs, which registers tsx first and then imports this file.
// Tasks may come before the last one is answered (a delivery thread takes many at once);
// each is answered by its id when done.
const port = parentPort;
if (!port) throw new Error('render-thread runs only as a worker thread');
port.on('message', ({ id, task }: { id: number; task: RenderTask }) => {
  void runRenderTask(task).then((answer) => port.postMessage({ id, answer }));
});
port.postMessage({ ready: true });

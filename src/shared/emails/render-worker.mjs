// Entry of a render thread (render-pool.ts). Plain JavaScript: a worker thread starts
// without the parent's TypeScript loader in every runner (tests, tools), so it registers
// tsx itself before importing the TypeScript task.
import { parentPort } from 'node:worker_threads';
import { register } from 'tsx/esm/api';

register();
const { runRenderTask } = await import('./render-task.ts');

parentPort.on('message', ({ id, task }) => {
  parentPort.postMessage({ id, answer: runRenderTask(task) });
});
parentPort.postMessage({ ready: true });

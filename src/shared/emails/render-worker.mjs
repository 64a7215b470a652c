// Entry of a render thread (render-pool.ts). Plain JavaScript: a worker thread starts
// without the parent's TypeScript loader in every runner (tests, tools), so it registers
// tsx itself before importing the TypeScript task.
import { register } from 'tsx/esm/api';

register();
const { runRenderTask } = await import('./render-task.ts');

export default runRenderTask;

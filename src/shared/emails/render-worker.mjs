// Entry of a render thread when the service runs from its TypeScript sources (tests, tsx):
// a worker thread starts without the parent's TypeScript loader, so it registers tsx itself
// before importing the thread's body. The compiled build starts dist/.../render-thread.js
// directly (render-pool.ts picks which).
import { register } from 'tsx/esm/api';

register();
await import('./render-thread.ts');

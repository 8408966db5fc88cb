/**
 * CPU-bound work off the event loop: `runInThread` calls a function exported by a module in a
 * worker thread, so the calling thread stays free to heartbeat (an activity whose event loop is
 * blocked sends nothing and is declared dead after temporal.heartbeat_timeout_s).
 *
 * The function gets its input (structured-cloned) and a `progress` callback whose values arrive
 * here through `onProgress`; its result (or thrown error's name and message) comes back the same
 * way. Modules load fresh in each thread: keep what a thread function imports small.
 */
import * as path from 'node:path';
import { Worker } from 'node:worker_threads';
import { NonRetryableError, type FailureType } from './failures';
import { projectRoot } from './paths';

/** The signature of a function `runInThread` can call. */
export type ThreadFunction<I, O> = (input: I, progress: (value: unknown) => void) => O | Promise<O>;

type ThreadMessage =
  | { progress: unknown }
  | { result: unknown }
  | { error: { name: string; message: string; stack?: string; type?: FailureType } };

const REGISTER_TS = path.join(projectRoot, 'lib', 'envs', 'register-ts.js');

/** Runs inside the thread: loads the module (TypeScript under jest, through register-ts), calls the function, posts back. */
const BOOTSTRAP = `
const { parentPort, workerData } = require('node:worker_threads');
const { module: file, fn, input, registerTs } = workerData;
if (registerTs) require(registerTs);
Promise.resolve()
  .then(() => require(file)[fn](input, (progress) => parentPort.postMessage({ progress })))
  .then(
    (result) => parentPort.postMessage({ result }),
    (e) => parentPort.postMessage({ error: { name: (e && e.name) || 'Error', message: e && e.message !== undefined ? e.message : String(e), stack: e && e.stack, type: e && typeof e.type === 'string' ? e.type : undefined } }),
  );
`;

/** A module of lib/ for `runInThread`, named relative to lib/ ('sft/prepare'): .ts under jest, .js in dist/. */
export function libModule(relative: string): string {
  return path.join(__dirname, `${relative}${path.extname(__filename)}`);
}

/** Node options that let a process run `module` (a fork): TypeScript under jest goes through register-ts. */
export function moduleExecArgv(module: string): string[] {
  return module.endsWith('.ts') ? ['--require', REGISTER_TS] : [];
}

/**
 * Calls `module`'s export `fn` with `input` in a new worker thread. Rejects with an Error of the
 * thrown error's name and message (a `NonRetryableError` as one, of its type), or when the thread
 * dies without an answer.
 */
export function runInThread<O>(
  module: string,
  fn: string,
  input: unknown,
  onProgress?: (value: unknown) => void,
): Promise<O> {
  return new Promise<O>((resolve, reject) => {
    const worker = new Worker(BOOTSTRAP, {
      eval: true,
      workerData: { module, fn, input, registerTs: module.endsWith('.ts') ? REGISTER_TS : undefined },
    });
    let settled = false;
    const settle = (f: () => void) => {
      if (settled) return;
      settled = true;
      f();
      void worker.terminate();
    };
    worker.on('message', (m: ThreadMessage) => {
      if ('progress' in m) onProgress?.(m.progress);
      else if ('result' in m) settle(() => resolve(m.result as O));
      else
        settle(() => {
          // A failure no retry fixes stays one (lib/failures.ts); any other error keeps its name.
          const { type } = m.error;
          const e =
            m.error.name === 'NonRetryableError' && type
              ? new NonRetryableError(m.error.message, type)
              : new Error(m.error.message);
          if (!(e instanceof NonRetryableError)) e.name = m.error.name;
          if (m.error.stack) e.stack = m.error.stack;
          reject(e);
        });
    });
    worker.on('error', (e) => settle(() => reject(e)));
    worker.on('exit', (code) =>
      settle(() =>
        reject(new Error(`${path.basename(module)}: the thread running ${fn} exited (code ${code}) without a result`)),
      ),
    );
  });
}

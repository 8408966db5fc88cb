/**
 * The supervisor of the inference server's prompt helpers (prompts.ts), a process of its own: it
 * forks the helpers (prompt-worker.ts) as a pool (lib/helper-pool.ts: one task at a time each, one
 * that runs past the time limit or dies of its heap limit killed, another started). The server forks only this process,
 * once, before its model loads: forking the server itself later would copy the page tables of its
 * weights, and could deadlock a matmul running on OpenBLAS's threads (its fork handlers stop them).
 * argv[2]: JSON `{dir, processes, timeoutMs, heapMb}`; messages `{id, task}` in, `{id, outcome}` out,
 * as JSON lines (prompts.ts says why).
 * It exits when the server goes away (its IPC channel closes), and its helpers with it.
 */
import { HelperPool, type HelperExit, type HelperOutcome } from '../helper-pool';
import { libModule, moduleExecArgv } from '../thread';
import type { PromptAnswer, PromptOutcome, PromptPoolOptions, PromptTask } from './prompts';

/**
 * What a helper that died of its task's appetite prints on its way out (V8's fatal errors): its
 * heap limit reached, or one allocation larger than V8 can make at all (a template's
 * `range(1000000000)` is a SIGTRAP with "invalid size error", `range(30000000)` the heap limit).
 */
const OUT_OF_MEMORY =
  /heap out of memory|Reached heap limit|invalid size error|invalid array length|Allocation failed/i;

/**
 * What a task ends with when its helper died running it. Every death is one of two: the task's
 * appetite (above: the template's or tokenizer's 400), or anything else, a 500 naming the signal or
 * exit code only (the helper's last words, native frame addresses among them, go to the server's
 * log, never to a client).
 */
function deathOutcome(exit: HelperExit, stderr: string): PromptOutcome {
  if ('failed' in exit) return { error: `prompt worker failed: ${exit.failed}` };
  if (OUT_OF_MEMORY.test(stderr)) return { refused: 'memory' };
  const how = exit.signal ?? `code ${exit.code}`;
  const last = stderr.trim().split('\n').slice(-8).join('\n');
  process.stderr.write(`[prompt helper] exited (${how}) while running a task${last ? `:\n${last}` : ''}\n`);
  return { error: `prompt worker exited (${how}) while running this request` };
}

/** A task's outcome as the server reads it. */
function promptOutcome(o: HelperOutcome<PromptAnswer>): PromptOutcome {
  if (o.ok) return o.value;
  switch (o.kind) {
    case 'error':
      return { error: o.error };
    case 'timeout':
      return { refused: 'timeout' };
    case 'died':
      return deathOutcome(o.exit, o.stderr);
  }
}

const { dir, ...options } = JSON.parse(process.argv[2]) as PromptPoolOptions & { dir: string };
const helper = libModule('inference/prompt-worker');
/** The helpers: each runs one task at a time, with the time and heap limits of `options`. */
const helpers = new HelperPool<PromptTask, PromptAnswer>({
  names: { pool: 'prompt helpers', helper: 'prompt helper' },
  module: helper,
  args: [dir],
  execArgv: moduleExecArgv(helper),
  processes: options.processes,
  timeoutMs: options.timeoutMs,
  heapMb: options.heapMb,
  start: 'lazy',
  output: 'tail',
});
process.on('message', ({ id, task }: { id: number; task: PromptTask }) => {
  // Once the server is gone (its channel closed while helpers were stopped), nobody is waiting.
  const answer = (outcome: PromptOutcome) => process.connected && process.send!({ id, outcome });
  helpers.run(task).then(
    (o) => answer(promptOutcome(o)),
    (e: Error) => answer({ error: e.message }),
  );
});
process.on('disconnect', () => void helpers.close().then(() => process.exit(0)));

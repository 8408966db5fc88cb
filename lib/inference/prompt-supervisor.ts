/**
 * The supervisor of the inference server's prompt helpers (prompts.ts), a process of its own: it
 * forks the helpers (prompt-worker.ts), hands each one task at a time, kills one that runs past
 * the time limit or dies of its heap limit, and starts another. The server forks only this process,
 * once, before its model loads: forking the server itself later would copy the page tables of its
 * weights, and could deadlock a matmul running on OpenBLAS's threads (its fork handlers stop them).
 * argv[2]: JSON `{dir, processes, timeoutMs, heapMb}`; messages `{id, task}` in, `{id, outcome}` out,
 * as JSON lines (prompts.ts says why).
 * It exits when the server goes away (its IPC channel closes), and its helpers with it.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { libModule, moduleExecArgv } from '../thread';
import type { PromptAnswer, PromptOutcome, PromptPoolOptions, PromptTask } from './prompts';

interface Pending {
  task: PromptTask;
  resolve(outcome: PromptOutcome): void;
  reject(e: Error): void;
}

interface Slot {
  child?: ChildProcess;
  /** The helper has loaded its tokenizer: a task's time counts from then. */
  ready: boolean;
  pending?: Pending;
  timer?: NodeJS.Timeout;
}

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
function deathOutcome(code: number | null, signal: NodeJS.Signals | null, stderr: string): PromptOutcome {
  if (OUT_OF_MEMORY.test(stderr)) return { refused: 'memory' };
  const how = signal ?? `code ${code}`;
  const last = stderr.trim().split('\n').slice(-8).join('\n');
  process.stderr.write(`[prompt helper] exited (${how}) while running a task${last ? `:\n${last}` : ''}\n`);
  return { error: `prompt worker exited (${how}) while running this request` };
}

/** The helpers: each runs one task at a time, with the time and heap limits of `options`. */
class HelperPool {
  private readonly slots: Slot[];
  private readonly queue: Pending[] = [];
  private closed = false;

  constructor(
    private readonly dir: string,
    private readonly options: PromptPoolOptions,
  ) {
    this.slots = Array.from({ length: options.processes }, () => ({ ready: false }));
  }

  close(): Promise<void> {
    this.closed = true;
    for (const p of this.queue.splice(0)) p.reject(new Error('prompt helpers closed'));
    const exits = this.slots.map((slot) => {
      const child = slot.child;
      slot.pending?.reject(new Error('prompt helpers closed'));
      this.reset(slot);
      if (!child || child.exitCode !== null || child.signalCode !== null) return undefined;
      const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
      child.kill('SIGKILL');
      return exited;
    });
    return Promise.all(exits).then(() => undefined);
  }

  run(task: PromptTask): Promise<PromptOutcome> {
    if (this.closed) return Promise.reject(new Error('prompt helpers closed'));
    return new Promise<PromptOutcome>((resolve, reject) => {
      this.queue.push({ task, resolve, reject });
      this.pump();
    });
  }

  /** Hands queued tasks to idle helpers, starting helpers as needed. */
  private pump(): void {
    for (const slot of this.slots) {
      if (this.queue.length === 0 || this.closed) return;
      if (slot.pending) continue;
      const child = slot.child ?? this.start(slot);
      slot.pending = this.queue.shift()!;
      child.send(slot.pending.task);
      if (slot.ready) this.arm(slot);
    }
  }

  private arm(slot: Slot): void {
    slot.timer = setTimeout(() => this.stop(slot, { refused: 'timeout' }), this.options.timeoutMs);
    slot.timer.unref();
  }

  /** Ends the slot's task with `outcome` and kills its helper; the next task gets a new one. */
  private stop(slot: Slot, outcome: PromptOutcome): void {
    const { child, pending } = slot;
    this.reset(slot);
    child?.kill('SIGKILL');
    pending?.resolve(outcome);
    this.pump();
  }

  private reset(slot: Slot): void {
    clearTimeout(slot.timer);
    Object.assign(slot, { child: undefined, ready: false, pending: undefined, timer: undefined });
  }

  private start(slot: Slot): ChildProcess {
    const module = libModule('inference/prompt-worker');
    const child = fork(module, [this.dir], {
      execArgv: [...moduleExecArgv(module), `--max-old-space-size=${this.options.heapMb}`],
      serialization: 'json',
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    });
    slot.child = child;
    // The end of its stderr: how it died (V8's fatal out-of-memory report, or a stack).
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4096)));
    // Events of a helper that was stopped (and replaced) are ignored.
    const current = () => slot.child === child;
    child.on('message', (m: PromptAnswer | { ready: true }) => {
      if (!current()) return;
      if ('ready' in m) {
        slot.ready = true;
        if (slot.pending) this.arm(slot);
        return;
      }
      const pending = slot.pending;
      clearTimeout(slot.timer);
      slot.pending = slot.timer = undefined;
      pending?.resolve(m);
      this.pump();
    });
    child.on('exit', (code, signal) => {
      if (!current()) return;
      // stderr may still hold unread data at 'exit'; 'close' comes once it is all read.
      child.once('close', () => this.stop(slot, deathOutcome(code, signal, stderr)));
    });
    child.on('error', (e) => {
      if (current()) this.stop(slot, { error: `prompt worker failed: ${e.message}` });
    });
    return child;
  }
}

const { dir, ...options } = JSON.parse(process.argv[2]) as PromptPoolOptions & { dir: string };
const helpers = new HelperPool(dir, options);
process.on('message', ({ id, task }: { id: number; task: PromptTask }) => {
  // Once the server is gone (its channel closed while helpers were stopped), nobody is waiting.
  const answer = (outcome: PromptOutcome) => process.connected && process.send!({ id, outcome });
  helpers.run(task).then(answer, (e: Error) => answer({ error: e.message }));
});
process.on('disconnect', () => void helpers.close().then(() => process.exit(0)));

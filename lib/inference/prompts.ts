/**
 * Prompts for the inference server, prepared off its event loop: chat templates are rendered and
 * prompt texts tokenized by a small pool of helper processes (prompt-worker.ts, run by
 * prompt-supervisor.ts), so `/health` and every other request keep answering while a megabyte
 * prompt is tokenized or a template runs. A model folder's template is code: it may loop
 * (`range(30000000)`) or grow without bound, so each task has a time limit (the helper past it is
 * killed and replaced) and each helper a heap limit. Processes, not worker threads: V8 aborts the
 * whole process when a thread's heap limit is hit by one large allocation (a template's
 * `range(100000000)` took the server down with it), while a helper that aborts takes only itself.
 * The callers first refuse what cheap bounds already show cannot fit the context, so no helper's
 * time is spent on it.
 */
import { fork, type ChildProcess } from 'node:child_process';
import type { ChatMessage, ChatRenderOptions } from '../model/chat';
import type { Tokenizer } from '../model/tokenizer';
import { libModule, moduleExecArgv } from '../thread';

export type PromptTask =
  | { kind: 'encode'; text: string }
  | {
      kind: 'chat';
      messages: ChatMessage[];
      options: ChatRenderOptions;
      /** Longest rendered text to tokenize, in UTF-16 units. */
      maxChars: number;
      /** Tokens of the context: a text whose lower bound reaches it is not tokenized. */
      contextLength: number;
    };

/** A helper's answer: the ids, or why there are none. */
export type PromptAnswer =
  | { ids: Int32Array }
  | { refused: 'template'; message: string }
  | { refused: 'too_large'; chars: number }
  | { refused: 'context'; atLeast: number }
  | { error: string };

/** What a task ends with: a helper's answer, or the limit that stopped it. */
export type PromptOutcome = PromptAnswer | { refused: 'timeout' | 'memory' };

export interface PromptPoolOptions {
  /** Helper processes (tasks at once). */
  processes: number;
  /** Longest a task may run. */
  timeoutMs: number;
  /** Heap of each helper (V8's old generation), in MiB. */
  heapMb: number;
}

/**
 * Runs `start` when no engine call is in flight (the server: between two decode steps), for the
 * rare fork of a new supervisor after the first died.
 */
export type ForkGate = (start: () => void) => Promise<void>;

/** The server's side of the prompt helpers: tasks go to the supervisor process and come back by id. */
export class PromptWorkers {
  private supervisor?: ChildProcess;
  private starting?: Promise<void>;
  private readonly inFlight = new Map<number, (outcome: PromptOutcome) => void>();
  private nextId = 1;
  private closed = false;

  /** Forks the supervisor now: a server makes this before it loads its model (see prompt-supervisor.ts). */
  constructor(
    readonly tokenizer: Tokenizer,
    readonly dir: string,
    readonly options: PromptPoolOptions,
    private readonly forkGate: ForkGate = async (start) => start(),
  ) {
    this.supervisor = this.startSupervisor();
  }

  /** Same ids as `tokenizer.encode(text)`, or the limit that stopped the tokenizer. */
  encode(text: string): Promise<PromptOutcome> {
    return this.run({ kind: 'encode', text });
  }

  /** The chat rendered by the tokenizer's template and tokenized, or why not (see `PromptAnswer`). */
  chat(
    messages: ChatMessage[],
    options: ChatRenderOptions,
    limits: { maxChars: number; contextLength: number },
  ): Promise<PromptOutcome> {
    return this.run({ kind: 'chat', messages, options, ...limits });
  }

  async close(): Promise<void> {
    this.closed = true;
    const child = this.supervisor;
    this.supervisor = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.disconnect(); // it stops its helpers and exits
    await exited;
  }

  private async run(task: PromptTask): Promise<PromptOutcome> {
    if (this.closed) throw new Error('prompt workers closed');
    if (!this.supervisor) {
      this.starting ??= this.forkGate(() => {
        this.supervisor ??= this.startSupervisor();
      }).finally(() => (this.starting = undefined));
      await this.starting;
    }
    const supervisor = this.supervisor!;
    const id = this.nextId++;
    return new Promise<PromptOutcome>((resolve) => {
      this.inFlight.set(id, resolve);
      supervisor.send({ id, task });
    });
  }

  private startSupervisor(): ChildProcess {
    const module = libModule('inference/prompt-supervisor');
    const child = fork(module, [JSON.stringify({ dir: this.dir, ...this.options })], {
      execArgv: moduleExecArgv(module),
      serialization: 'advanced',
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    child.on('message', ({ id, outcome }: { id: number; outcome: PromptOutcome }) => {
      const resolve = this.inFlight.get(id);
      this.inFlight.delete(id);
      resolve?.(outcome);
    });
    const gone = (why: string) => {
      if (this.supervisor !== child) return;
      this.supervisor = undefined; // the next task starts another
      for (const resolve of this.inFlight.values()) resolve({ error: `the prompt supervisor ${why}` });
      this.inFlight.clear();
    };
    child.on('exit', (code, signal) => gone(`exited (${signal ?? `code ${code}`})`));
    child.on('error', (e) => gone(`failed: ${e.message}`));
    return child;
  }
}

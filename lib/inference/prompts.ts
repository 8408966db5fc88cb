/**
 * Prompts for the inference server, prepared off its event loop: chat templates are rendered and
 * prompt texts tokenized by a small pool of helper processes (prompt-worker.ts, run by
 * prompt-supervisor.ts), so `/health` and every other request keep answering while a megabyte
 * prompt is tokenized or a template runs. A model folder's template is code: it may loop
 * (`range(30000000)`) or grow without bound, so each task has a time limit (the helper past it is
 * killed and replaced) and each helper a heap limit (lib/helper-pool.ts). Processes, not worker threads: V8 aborts the
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
  | { ids: number[] }
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

/** A task handed to the supervisor, until its outcome comes back. */
interface InFlight {
  task: PromptTask;
  resolve(outcome: PromptOutcome): void;
  /** Supervisors that died while it was in flight. */
  deaths: number;
}

/** A task in flight at this many supervisor deaths fails, whatever the cause (no endless restarts). */
const MAX_SUPERVISOR_DEATHS = 2;

/**
 * The server's side of the prompt helpers: tasks go to the supervisor process and come back by id.
 * Messages cross as JSON lines (Node's `json` serialization), which are parsed without recursion:
 * nothing a request holds can kill the supervisor or a helper as it is read (a chat nested 2,000
 * deep overflowed the stack of the structured-clone deserializer, and the supervisor's death failed
 * every request in flight). Bodies are bounded in depth before they get here (protocol.ts), so
 * that sending them cannot overflow either. Should the supervisor die all the same (killed), the
 * tasks in flight go to the next one.
 */
export class PromptWorkers {
  private supervisor?: ChildProcess;
  private starting?: Promise<void>;
  private readonly inFlight = new Map<number, InFlight>();
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
    for (const t of this.inFlight.values()) t.resolve({ error: 'prompt workers closed' });
    this.inFlight.clear();
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.disconnect(); // it stops its helpers and exits
    await exited;
  }

  private run(task: PromptTask): Promise<PromptOutcome> {
    if (this.closed) return Promise.reject(new Error('prompt workers closed'));
    return new Promise<PromptOutcome>((resolve) => {
      const id = this.nextId++;
      this.inFlight.set(id, { task, resolve, deaths: 0 });
      void this.send(id);
    });
  }

  /** Sends task `id` to the supervisor, starting one (between two engine steps) if none runs. */
  private async send(id: number): Promise<void> {
    if (!this.supervisor) {
      this.starting ??= this.forkGate(() => {
        if (!this.closed) this.supervisor ??= this.startSupervisor();
      }).finally(() => (this.starting = undefined));
      await this.starting;
    }
    const t = this.inFlight.get(id);
    if (!t) return;
    if (!this.supervisor) return t.resolve({ error: 'prompt workers closed' });
    this.supervisor.send({ id, task: t.task });
  }

  private startSupervisor(): ChildProcess {
    const module = libModule('inference/prompt-supervisor');
    const child = fork(module, [JSON.stringify({ dir: this.dir, ...this.options })], {
      execArgv: moduleExecArgv(module),
      serialization: 'json',
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    child.on('message', ({ id, outcome }: { id: number; outcome: PromptOutcome }) => {
      const t = this.inFlight.get(id);
      if (this.supervisor !== child || !t) return;
      this.inFlight.delete(id);
      t.resolve(outcome);
    });
    // Gone once it has exited and its channel has closed (every answer it sent has been read).
    let why = '';
    let ends = 2;
    const ended = () => --ends === 0 && this.gone(child, why);
    child.once('exit', (code, signal) => {
      why = `exited (${signal ?? `code ${code}`})`;
      ended();
    });
    child.once('disconnect', ended);
    child.on('error', (e) => {
      // Not started at all: no exit will come, nor a channel to close.
      if (child.pid === undefined) this.gone(child, `failed to start: ${e.message}`);
    });
    return child;
  }

  /** The supervisor `child` is gone: its tasks go to the next one, unless they have seen too many go. */
  private gone(child: ChildProcess, why: string): void {
    if (this.supervisor !== child) return;
    this.supervisor = undefined;
    for (const [id, t] of [...this.inFlight].sort(([a], [b]) => a - b)) {
      if (++t.deaths < MAX_SUPERVISOR_DEATHS) void this.send(id);
      else {
        this.inFlight.delete(id);
        t.resolve({ error: `the prompt supervisor ${why} (${t.deaths} supervisors died with this request in flight)` });
      }
    }
  }
}

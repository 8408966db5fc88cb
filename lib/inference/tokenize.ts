/**
 * Prompt tokenization for the inference server that never stalls the event loop: short texts
 * (the common case) are tokenized inline, long ones on a worker thread (tokenize-worker.ts), so
 * `/health` and every other route keep answering while a megabyte prompt is tokenized. The
 * callers first refuse texts whose cheap lower bound (`Tokenizer.minTokens`) already exceeds the
 * context, so no CPU is spent on prompts that cannot be served.
 */
import type { Worker } from 'node:worker_threads';
import type { Tokenizer } from '../model/tokenizer';
import { libModule, moduleWorker } from '../thread';

/** Texts up to this many UTF-16 units are tokenized inline (a few milliseconds at most). */
const INLINE_CHARS = 4096;

interface Pending {
  resolve(ids: number[]): void;
  reject(e: Error): void;
}

export class PromptTokenizer {
  private worker?: { thread: Worker; pending: Map<number, Pending> };
  private nextId = 1;
  private closed = false;

  constructor(
    readonly tokenizer: Tokenizer,
    private readonly dir: string,
  ) {}

  /** Same ids as `tokenizer.encode(text)`. */
  async encode(text: string): Promise<number[]> {
    if (text.length <= INLINE_CHARS) return this.tokenizer.encode(text);
    if (this.closed) throw new Error('tokenizer closed');
    const worker = this.worker ?? this.start();
    const id = this.nextId++;
    return new Promise<number[]>((resolve, reject) => {
      worker.pending.set(id, { resolve, reject });
      worker.thread.postMessage({ id, text });
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    const w = this.worker;
    this.worker = undefined;
    await w?.thread.terminate();
  }

  private start(): { thread: Worker; pending: Map<number, Pending> } {
    const thread = moduleWorker(libModule('inference/tokenize-worker'), { dir: this.dir });
    thread.unref();
    const worker = { thread, pending: new Map<number, Pending>() };
    thread.on('message', (m: { id: number; ids?: Int32Array; error?: string }) => {
      const p = worker.pending.get(m.id);
      if (!p) return;
      worker.pending.delete(m.id);
      if (m.ids) p.resolve(Array.from(m.ids));
      else p.reject(new Error(m.error ?? 'tokenizer worker failed'));
    });
    const fail = (why: string) => {
      if (this.worker === worker) this.worker = undefined; // the next long prompt starts a new one
      for (const p of worker.pending.values()) p.reject(new Error(`tokenizer worker ${why}`));
      worker.pending.clear();
    };
    thread.on('error', (e) => fail(`failed: ${e.message}`));
    thread.on('exit', (code) => fail(`exited (code ${code})`));
    this.worker = worker;
    return worker;
  }
}

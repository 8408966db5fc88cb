/**
 * Online distillation (`[distill] teacher`): the teacher's logprob of every token the student
 * sampled, from one request per sample to the teacher's OpenAI-compatible server: the standard
 * (legacy) completions route with `echo` and `logprobs: 0`, whose answer lists the prompt's tokens
 * with their logprobs before the one generated token. Our inference server and vLLM both implement
 * it. Packing turns them into per-token advantages (teacher - student: reverse KL,
 * lib/orchestrator/sample.ts).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Tokenizer } from '../model/tokenizer';
import { classifyStatus, httpErrorText, InferenceError } from './client';
import { ServerWatch } from './server-watch';
import type { TokenSegment } from '../runfolder/packing';

/**
 * Whether two model folders hold the same tokenizer files, byte for byte (tokenizer.json,
 * tokenizer_config.json, generation_config.json: what a Tokenizer's ids and end-of-sequence tokens
 * come from): then their ids mean the same without loading either (a vocabulary of 150,000 tokens
 * takes seconds to load and compare, more on a busy machine).
 */
export function sameTokenizerFiles(a: string, b: string): boolean {
  return ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json'].every((name) => {
    const [x, y] = [path.join(a, name), path.join(b, name)];
    if (!fs.existsSync(x) || !fs.existsSync(y)) return fs.existsSync(x) === fs.existsSync(y);
    return fs.statSync(x).size === fs.statSync(y).size && fs.readFileSync(x).equals(fs.readFileSync(y));
  });
}

/** Why `teacher`'s token ids mean something else than `student`'s, or undefined when they are the same. */
export function tokenizerMismatch(student: Tokenizer, teacher: Tokenizer): string | undefined {
  if (student.size !== teacher.size) return `its vocabulary has ${teacher.size} tokens, the student's ${student.size}`;
  for (let id = 0; id < student.size; id++) {
    const [a, b] = [student.idToToken(id), teacher.idToToken(id)];
    if (a !== b) return `token id ${id} is ${JSON.stringify(b)}, the student's is ${JSON.stringify(a)}`;
  }
  if (student.eosTokenIds.join() !== teacher.eosTokenIds.join())
    return `its end-of-sequence tokens are [${teacher.eosTokenIds}], the student's [${student.eosTokenIds}]`;
  return undefined;
}

/** `[distill] teacher`'s server settings, as in config. */
export interface TeacherServer {
  /** The config key errors name (`distill.teacher`); self-distillation names the policy's servers. */
  key?: string;
  /** `distill.teacher.base_url`: `http://host:port/v1`. */
  base_url: string;
  /** `distill.teacher.served_model`; unset: the one model the server lists. */
  served_model?: string;
  /** `distill.teacher.api_key_var`: the environment variable holding its bearer token. */
  api_key_var?: string;
}

export class TeacherClient {
  private readonly key: string;
  private readonly baseUrl: string;
  private readonly servedModel?: string;
  private readonly apiKey?: string;
  /** The served model's name, once read from `GET /models` (when `servedModel` is unset). */
  private listed?: Promise<string>;
  private readonly timeoutMs: number;
  /** The teacher's liveness while requests to it are in flight (lib/orchestrator/server-watch.ts). */
  private readonly watch: ServerWatch;

  /**
   * `timeoutMs` bounds each request (10 minutes); a teacher silent (no answer, not even to
   * `/health`) for `livenessMs` (60 s) while requests are in flight fails them at once.
   */
  constructor(server: TeacherServer, opts: { timeoutMs?: number; livenessMs?: number } = {}) {
    this.timeoutMs = opts.timeoutMs ?? 600_000;
    this.key = server.key ?? 'distill.teacher';
    this.baseUrl = server.base_url.replace(/\/+$/, '');
    this.watch = new ServerWatch(this.baseUrl.replace(/\/v1$/, ''), opts.livenessMs ?? 60_000, () =>
      this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : ({} as Record<string, string>),
    );
    this.servedModel = server.served_model;
    if (server.api_key_var !== undefined) {
      this.apiKey = process.env[server.api_key_var];
      if (!this.apiKey)
        throw new InferenceError(
          `${this.key}.api_key_var names environment variable ${server.api_key_var}, which is not set (or empty) in this worker's environment`,
          undefined,
          'config',
        );
    }
  }

  /** The teacher's logprob of `ids[i]` given `ids[<i]`, for i >= 1 (index 0: null). */
  async promptLogprobs(ids: readonly number[]): Promise<(number | null)[]> {
    const model = await this.model();
    // Temperature 1: a server that applies it to logprobs then gives the raw ones too.
    const body = await this.request('/completions', {
      model,
      prompt: ids,
      max_tokens: 1,
      echo: true,
      logprobs: 0,
      temperature: 1,
    });
    const logprobs = (body as { choices?: { logprobs?: { token_logprobs?: unknown } | null }[] } | null)?.choices?.[0]
      ?.logprobs?.token_logprobs;
    // The prompt's tokens (the first has no logprob), then the generated token.
    if (
      !Array.isArray(logprobs) ||
      logprobs.length !== ids.length + 1 ||
      logprobs.slice(1, ids.length).some((v) => typeof v !== 'number')
    ) {
      const got = Array.isArray(logprobs) ? `${logprobs.length} entries` : 'none';
      throw new InferenceError(
        `${this.key}.base_url: ${this.baseUrl}/completions returned no logprobs of the prompt's tokens: with echo: true and logprobs: 0, choices[0].logprobs.token_logprobs must list the ${ids.length} prompt tokens' logprobs and then the generated token's (got ${got}); the teacher's server must implement echo on /completions (prime-rl inference and vLLM do)`,
        undefined,
        'config',
      );
    }
    return [null, ...(logprobs.slice(1, ids.length) as number[])];
  }

  /** The model name the requests carry: `servedModel`, else the only one `GET /models` lists (read once). */
  private model(): Promise<string> {
    if (this.servedModel !== undefined) return Promise.resolve(this.servedModel);
    this.listed ??= this.listedModel().catch((e: unknown) => {
      this.listed = undefined; // a failed read is tried again by the next request
      throw e;
    });
    return this.listed;
  }

  private async listedModel(): Promise<string> {
    const body = (await this.request('/models')) as { data?: { id?: unknown }[] } | null;
    const ids = (Array.isArray(body?.data) ? body.data : []).map((m) => m?.id).filter((id) => typeof id === 'string');
    if (ids.length === 1) return ids[0];
    throw new InferenceError(
      ids.length === 0
        ? `${this.key}.base_url: ${this.baseUrl}/models lists no model: not an OpenAI-compatible server? (or set ${this.key}.served_model)`
        : `${this.key}.served_model: unset, and the teacher's server ${this.baseUrl} serves ${ids.length} models (${ids.join(', ')}): set it to the teacher's`,
      undefined,
      'config',
    );
  }

  /** GET (no body) or POST `body` to `route` of the teacher's server; its JSON answer. */
  private request(route: string, body?: unknown): Promise<unknown> {
    return this.watch.run((silenced) => this.watchedRequest(route, silenced, body));
  }

  private async watchedRequest(route: string, silenced: AbortSignal, body?: unknown): Promise<unknown> {
    const url = `${this.baseUrl}${route}`;
    let res: Response;
    let text: string;
    try {
      res = await fetch(url, {
        method: body === undefined ? 'GET' : 'POST',
        headers: {
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
          ...(this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {}),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.any([AbortSignal.timeout(this.timeoutMs), silenced]),
      });
      this.watch.answered();
      text = await res.text();
    } catch (e) {
      throw new InferenceError(`teacher ${url} unreachable: ${(e as Error).message}`, undefined, 'unavailable');
    }
    if (!res.ok) {
      // Every 4xx stops the run: the teacher refuses what distillation needs (distill.teacher.base_url).
      const kind = classifyStatus(res.status, 'control');
      throw new InferenceError(`${this.key}.base_url: ${url}: ${httpErrorText(res.status, text)}`, res.status, kind);
    }
    try {
      return JSON.parse(text) as unknown;
    } catch {
      throw new InferenceError(
        `${this.key}.base_url: ${url} answered with no JSON: ${text.slice(0, 200)}`,
        res.status,
        'config',
      );
    }
  }

  /**
   * Adds `teacherLogprobs` to the generated segments of `samples` (one request per sample), each
   * scored after `prefix` (self-distillation's demonstration; none for a teacher). What does not
   * fit the server's context of `seqLen` with room for the one token it generates (the prefix
   * and the sample's tokens, up to seqLen - 1) is not sent, and those tokens get no teacher
   * logprob (null: no distillation term).
   */
  async annotate(samples: readonly TokenSegment[][], seqLen: number, prefix: readonly number[] = []): Promise<void> {
    await Promise.all(
      samples.map(async (segments) => {
        const ids = segments.flatMap((s) => Array.from(s.tokens));
        const sent = [...prefix, ...ids].slice(0, seqLen - 1);
        const logprobs = (await this.promptLogprobs(sent)).slice(prefix.length);
        let at = 0;
        for (const s of segments) {
          const n = s.tokens.length;
          if (s.generated) s.teacherLogprobs = Array.from({ length: n }, (_, i) => logprobs[at + i] ?? null);
          at += n;
        }
      }),
    );
  }
}

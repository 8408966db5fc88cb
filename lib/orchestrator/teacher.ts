/**
 * Online distillation (`[distill] teacher`): the teacher's logprob of every token the student
 * sampled, from one prompt-logprobs request per sample to the teacher's inference server
 * (`/v1/generate` with `prompt_logprobs`). Packing turns them into per-token advantages
 * (teacher - student: reverse KL, lib/orchestrator/packing.ts).
 */
import type { Tokenizer } from '../model/tokenizer';
import { classifyStatus, httpErrorText, InferenceError } from './client';
import type { TokenSegment } from './packing';

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

export class TeacherClient {
  constructor(
    /** As in config: `http://host:port/v1`. */
    private readonly baseUrl: string,
    private readonly timeoutMs = 600_000,
  ) {}

  /** The teacher's logprob of `ids[i]` given `ids[<i]`, for i >= 1 (index 0: null). */
  async promptLogprobs(ids: readonly number[]): Promise<(number | null)[]> {
    const url = `${this.baseUrl.replace(/\/+$/, '').replace(/\/v1$/, '')}/v1/generate`;
    let res: Response;
    try {
      res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt_token_ids: ids, max_tokens: 1, prompt_logprobs: true }),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      throw new InferenceError(`teacher ${url} unreachable: ${(e as Error).message}`, undefined, 'unavailable');
    }
    const text = await res.text();
    if (!res.ok) {
      // Every 4xx stops the run: the teacher refuses what distillation needs (distill.teacher.base_url).
      const kind = classifyStatus(res.status, 'control');
      throw new InferenceError(
        `distill.teacher.base_url: ${url}: ${httpErrorText(res.status, text)}`,
        res.status,
        kind,
      );
    }
    const logprobs = (JSON.parse(text) as { prompt_logprobs?: (number | null)[] | null }).prompt_logprobs;
    if (!Array.isArray(logprobs) || logprobs.length !== ids.length)
      throw new InferenceError(
        `distill.teacher.base_url: ${url} returned no prompt logprobs for ${ids.length} tokens: not a prime-rl inference server?`,
        res.status,
        'config',
      );
    return logprobs;
  }

  /**
   * Adds `teacherLogprobs` to the generated segments of `samples` (one request per sample). A
   * sample of `seqLen` tokens leaves the teacher no room to generate its one token: its last token
   * is not sent and gets no teacher logprob (null: no distillation term).
   */
  async annotate(samples: readonly TokenSegment[][], seqLen: number): Promise<void> {
    await Promise.all(
      samples.map(async (segments) => {
        const ids = segments.flatMap((s) => Array.from(s.tokens));
        const sent = ids.length < seqLen ? ids : ids.slice(0, seqLen - 1);
        const logprobs = await this.promptLogprobs(sent);
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

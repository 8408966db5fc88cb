/**
 * bf16 against fp32 on one model folder: how far a bf16 model's per-token logprobs are from the
 * fp32 model's, for the scoring forward (the trainer's and the evals' path) and for decode (the
 * generator's: paged attention, the decode step's GEMMs, the LM head), on the same tokens. Prints
 * the mean, 99th percentile and largest absolute difference, and how long greedy decode stays on
 * fp32's tokens.
 *
 *   npm run build:ts && node dist/bench/dtype-diff.js [--model build/bench-models/small-qwen3]
 *     [--device cpu] [--rows 8] [--len 256] [--new 64] [--threads 2]
 */
import { setThreads, type NativeModel } from '../native';
import { loadModel } from '../lib/model/engine';
import { loadHfModel } from '../lib/model/hf';
import { packRow, randomTokens } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}

function stats(diffs: number[]): string {
  const d = [...diffs].sort((a, b) => a - b);
  const mean = d.reduce((s, x) => s + x, 0) / d.length;
  return `mean ${mean.toExponential(2)}, p99 ${d[Math.floor(0.99 * (d.length - 1))].toExponential(2)}, max ${d[d.length - 1].toExponential(2)} (${d.length} tokens)`;
}

async function greedy(model: NativeModel, prompts: number[][], maxTokens: number) {
  const gen = model.createGenerator({ maxSequences: prompts.length, maxSequenceLength: 4096 });
  const added = await gen.add(prompts.map((p, i) => ({ promptIds: p, maxTokens, temperature: 0, seed: i })));
  const index = new Map(added.map((a, i) => [a.seqId, i]));
  const tokens: number[][] = prompts.map(() => []),
    logprobs: number[][] = prompts.map(() => []);
  while (gen.stats().activeSequences > 0)
    for (const t of await gen.step()) {
      tokens[index.get(t.seqId)!].push(t.token);
      logprobs[index.get(t.seqId)!].push(t.logprob);
    }
  return { tokens, logprobs };
}

async function main(): Promise<void> {
  const dir = arg('model', 'build/bench-models/small-qwen3');
  const device = arg('device', 'cpu'),
    rows = Number(arg('rows', '8')),
    len = Number(arg('len', '256')),
    fresh = Number(arg('new', '64'));
  setThreads(Number(arg('threads', '2')));
  const base = loadHfModel(dir);
  const fp32 = await loadModel(base.config, base.tensors, { device, dtype: 'float32' });
  const bf16 = await loadModel(base.config, base.tensors, { device, dtype: 'bfloat16' });
  const rng = new Rng(0);
  const texts = Array.from({ length: rows }, () => randomTokens(rng, len, base.config.vocabSize));
  // Scoring: the same rows through both models.
  const [a, b] = await Promise.all([fp32, bf16].map((m) => m.score(texts.map((t) => packRow([t])))));
  const scoring = a.flatMap((r, i) => Array.from(r.logprobs.slice(1), (lp, j) => Math.abs(lp - b[i].logprobs[j + 1])));
  // Decode: bf16 greedy decode; its tokens scored by the fp32 model (the same positions).
  const prompts = texts.map((t) => t.slice(0, len / 2));
  const dec = await greedy(bf16, prompts, fresh);
  const exact = await fp32.score(prompts.map((p, i) => packRow([[...p, ...dec.tokens[i]]])));
  const decode = dec.logprobs.flatMap((lps, i) =>
    lps.map((lp, j) => Math.abs(lp - exact[i].logprobs[prompts[i].length + j])),
  );
  const ref = await greedy(fp32, prompts, fresh);
  // Tokens before the first that differs (after it the two decode different texts).
  const agree = dec.tokens.map((ts, i) => {
    const j = ts.findIndex((t, k) => t !== ref.tokens[i][k]);
    return j < 0 ? ts.length : j;
  });
  console.log(`${dir}, ${device}: bf16 against fp32, |logprob difference|`);
  console.log(`- scoring forward (${rows} rows of ${len}): ${stats(scoring)}`);
  console.log(`- decode (${rows} x ${fresh} greedy tokens, scored by fp32): ${stats(decode)}`);
  console.log(
    `- greedy decode equal to fp32's for ${agree.filter((n) => n === fresh).length} of ${rows} sequences; ` +
      `tokens before the first difference: ${agree.join(', ')}`,
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

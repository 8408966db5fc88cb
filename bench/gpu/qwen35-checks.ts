/**
 * The GPU checks of Qwen3.5 (issue #46), a section of bench/gpu/checks.ts: the hybrid model's
 * libtorch-op path (Gated DeltaNet's chunked and recurrent delta rule, gated attention) on the
 * device against transformers' fp32 fixtures (test/fixtures/hf-reference/qwen3_5*, written by
 * scripts/check_hf_compat.py): logprobs and one training step's gradients in fp32, the paged
 * forward with state slots and greedy decoding, and bf16 (a bf16 model's logprobs, a mixed-precision
 * training step). They run on `cpu` too (the bf16 ones then skip).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { loadModel } from '../../lib/model/engine';
import { loadHfModel, type HfModel } from '../../lib/model/hf';
import { readSafetensors } from '../../lib/model/safetensors';
import { decode } from '../../lib/model/testing';
import { projectRoot } from '../../lib/paths';
import type { TrainRow, WeightTensor } from '../../native';
import { verdict, type Check, type CheckResult } from './check';

const FIXTURES = path.join(projectRoot, 'test', 'fixtures', 'hf-reference');

interface Fixture {
  name: string;
  dir: string;
  sequences: number[][];
  greedy: number[];
  logits: Float32Array;
  vocab: number;
}

/** The Qwen3.5 fixture folders (those with gradients), or why there are none. */
function fixtures(): Fixture[] | string {
  if (!fs.existsSync(FIXTURES)) return `${FIXTURES} is not here`;
  const out: Fixture[] = [];
  for (const name of fs.readdirSync(FIXTURES).sort()) {
    const dir = path.join(FIXTURES, name);
    if (!fs.existsSync(path.join(dir, 'grads.safetensors'))) continue;
    const meta = JSON.parse(fs.readFileSync(path.join(dir, 'meta.json'), 'utf8'));
    const raw = fs.readFileSync(path.join(dir, 'logits.bin'));
    out.push({
      name,
      dir,
      sequences: [meta.tokens_a, meta.tokens_b, meta.tokens_c],
      greedy: meta.greedy_a,
      logits: new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length)),
      vocab: meta.vocab_size,
    });
  }
  return out.length > 0 ? out : `no Qwen3.5 fixtures in ${FIXTURES}`;
}

/** transformers' log p(token t | tokens before) of every fixture position (0 at each sequence's first). */
function referenceLogprobs(f: Fixture): number[] {
  const out: number[] = [];
  let row = 0;
  for (const seq of f.sequences) {
    out.push(0);
    for (let t = 1; t < seq.length; t++) {
      const z = f.logits.subarray((row + t - 1) * f.vocab, (row + t) * f.vocab);
      let max = -Infinity;
      for (const v of z) max = Math.max(max, v);
      let sum = 0;
      for (const v of z) sum += Math.exp(v - max);
      out.push(z[seq[t]] - max - Math.log(sum));
    }
    row += seq.length;
  }
  return out;
}

const packed = (f: Fixture): TrainRow => ({
  inputIds: f.sequences.flat(),
  positionIds: f.sequences.flatMap((s) => s.map((_, i) => i)),
  lossMask: f.sequences.flatMap((s) => s.map((_, i) => (i > 0 ? 1 : 0))),
});

const isCuda = (device: string) => device.startsWith('cuda');
const fmt = (x: number) => x.toExponential(2);

/** `per` over every fixture (with its folder loaded), the verdicts and details joined. */
async function eachFixture(
  per: (f: Fixture, hf: HfModel) => Promise<{ ok: boolean; detail: string }>,
  bounds: string,
): Promise<CheckResult> {
  const all = fixtures();
  if (typeof all === 'string') return { status: 'skip', detail: all };
  const results = [];
  for (const f of all) results.push(await per(f, loadHfModel(f.dir)));
  return verdict(
    results.every((r) => r.ok),
    `${results.map((r) => r.detail).join('; ')} (${bounds})`,
  );
}

/** fp32: logprobs, gradients, the state path and greedy decoding, each fixture. */
const fp32: Check = {
  name: 'Qwen3.5 vs transformers fixtures, fp32: logprobs, gradients, state slots, greedy decode',
  run: (ctx) =>
    eachFixture(async (f, hf) => {
      const model = await loadModel(hf.config, hf.tensors, { device: ctx.device });
      const [scores] = await model.score([packed(f)]);
      const ref = referenceLogprobs(f);
      let lp = 0;
      for (let i = 0; i < ref.length; i++) lp = Math.max(lp, Math.abs(scores.logprobs[i] - ref[i]));
      const { gradients } = await model.createTrainer({ weightDecay: 0 }).gradients([packed(f)], { kind: 'ce' });
      const theirs = new Map(readSafetensors(path.join(f.dir, 'grads.safetensors')).tensors.map((t) => [t.name, t]));
      let grad = 0;
      for (const g of gradients) {
        const a = decode(g),
          b = decode(theirs.get(g.name)! as WeightTensor);
        let d = 0,
          s = 0;
        for (let i = 0; i < a.length; i++)
          ((d = Math.max(d, Math.abs(a[i] - b[i]))), (s = Math.max(s, Math.abs(b[i]))));
        grad = Math.max(grad, d / Math.max(s, 1e-30));
      }
      const state = await model.statePathCheck({ prompt: f.sequences[2], prefillChunk: 50, snapshotAt: 96 });
      const greedy = await model.statePathCheck({ prompt: f.sequences[0], greedySteps: f.greedy.length });
      const stateDiff = Math.max(state.prefillDiff, state.snapshotDiff, state.decodeDiff);
      const same = greedy.greedy.every((t, i) => t === f.greedy[i]);
      return {
        ok: lp <= 1e-4 && grad <= 1e-4 && stateDiff <= 1e-4 && same,
        detail: `${f.name}: logprobs ${fmt(lp)}, gradients ${fmt(grad)} relative, state ${fmt(stateDiff)}, greedy ${same ? 'equal' : 'differs'}`,
      };
    }, 'bounds 1e-4'),
};

/**
 * bf16 on the card: a bf16 model's logprobs near transformers' fp32 ones (bf16 rounds every matmul
 * input to 8 significant bits: mean |difference| within 0.05) and a mixed-precision training step
 * with a finite loss near the fp32 one.
 */
const bf16: Check = {
  name: 'Qwen3.5 in bf16: logprobs near transformers fp32, a mixed-precision training step',
  async run(ctx) {
    if (!isCuda(ctx.device)) return { status: 'skip', detail: 'no CUDA (bf16 is meant for CUDA)' };
    return eachFixture(async (f, hf) => {
      const model = await loadModel(hf.config, hf.tensors, { device: ctx.device, dtype: 'bfloat16' });
      const [scores] = await model.score([packed(f)]);
      const ref = referenceLogprobs(f);
      let mean = 0;
      for (let i = 0; i < ref.length; i++) mean += Math.abs(scores.logprobs[i] - ref[i]) / ref.length;
      const fp32 = await loadModel(hf.config, hf.tensors, { device: ctx.device });
      const exact = await fp32.createTrainer({ weightDecay: 0 }).gradients([packed(f)], { kind: 'ce' });
      const mixed = await fp32
        .createTrainer({ weightDecay: 0, mixedPrecision: 'bfloat16' })
        .gradients([packed(f)], { kind: 'ce' });
      const lossGap = Math.abs(mixed.metrics.loss - exact.metrics.loss);
      return {
        ok: mean <= 0.05 && Number.isFinite(mixed.metrics.loss) && lossGap <= 0.05,
        detail: `${f.name}: logprobs mean |bf16 - fp32 HF| ${fmt(mean)}, mixed-precision loss gap ${fmt(lossGap)}`,
      };
    }, 'bounds 0.05');
  },
};

/** The Qwen3.5 section, after the engine checks of bench/gpu/checks.ts. */
export const QWEN35_CHECKS: Check[] = [fp32, bf16];

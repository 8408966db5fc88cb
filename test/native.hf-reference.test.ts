/**
 * The native engine against Hugging Face transformers itself: logits that transformers computed
 * (fp32, by scripts/check_hf_compat.py --write-fixtures) for every fixture folder (small Llama,
 * Qwen2, Qwen3, Qwen3-MoE and Qwen3.5 models, and variants such as MoE's decoder_sparse_step 2 or
 * Qwen3.5's multimodal checkpoint) with perturbed norms and biases, so every weight matters. The
 * sequences go in one packed row. Qwen3.5's fixtures also hold a sequence longer than the delta
 * rule's chunk and one training step's gradients.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { loadModel } from '../lib/model/engine';
import { loadHfModel } from '../lib/model/hf';
import { readSafetensors } from '../lib/model/safetensors';
import { decode } from '../lib/model/testing';
import type { WeightTensor } from '../lib/model/arch';
import { HF_FIXTURES, fixtureSequences } from './support/hf-fixtures';

function logSoftmax(row: Float32Array): Float64Array {
  let max = -Infinity;
  for (const v of row) max = Math.max(max, v);
  let sum = 0;
  for (const v of row) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  return Float64Array.from(row, (v) => v - lse);
}

test('fixtures exist for llama, qwen2, qwen3 and qwen3_moe, and for MoE with decoder_sparse_step > 1 and mlp_only_layers', () => {
  expect(HF_FIXTURES.map((f) => f.meta.createOptions.arch)).toEqual(
    expect.arrayContaining(['llama', 'qwen2', 'qwen3', 'qwen3_moe']),
  );
  const moe = HF_FIXTURES.map((f) => f.meta.createOptions.moe).filter((m) => m !== undefined);
  expect(moe.some((m) => (m.decoderSparseStep ?? 1) > 1 && (m.mlpOnlyLayers ?? []).length > 0)).toBe(true);
});

test.each(HF_FIXTURES.map((f) => [f.name, f] as const))(
  '%s: packed scoring equals transformers token by token',
  async (_, { dir, meta }) => {
    const raw = fs.readFileSync(path.join(dir, 'logits.bin'));
    const logits = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length));
    const hf = loadHfModel(dir);
    const model = await loadModel(hf.config, hf.tensors);
    const seqs = fixtureSequences(meta);
    const ids = seqs.flat();
    const positions = seqs.flatMap((s) => s.map((_, i) => i));
    const [scores] = await model.score([{ inputIds: ids, positionIds: positions }]);
    let worst = 0;
    let offset = 0;
    for (const seq of seqs) {
      for (let t = 1; t < seq.length; t++) {
        // HF row t-1 of this sequence predicts token t.
        const row = logits.subarray((offset + t - 1) * meta.vocab_size, (offset + t) * meta.vocab_size);
        const expected = logSoftmax(row)[seq[t]];
        worst = Math.max(worst, Math.abs(scores.logprobs[offset + t] - expected));
      }
      offset += seq.length;
    }
    // Logits here are O(10) (weights x10); measured worst difference is 4e-6, the last bits of fp32;
    // 1.3e-5 for Qwen3.5's 227 positions through the delta rule's chunked and sequential fp32 sums.
    expect(worst).toBeLessThan(meta.tokens_c ? 1e-4 : 1e-5);
  },
);

const WITH_GRADIENTS = HF_FIXTURES.filter((f) => f.meta.grads);

test('the hybrid fixtures cover text-only and multimodal, tied and untied Qwen3.5, and Qwen3.5-MoE', () => {
  expect(WITH_GRADIENTS.map((f) => f.meta.createOptions.arch)).toEqual(
    expect.arrayContaining(['qwen3_5_text', 'qwen3_5', 'qwen3_5_moe_text']),
  );
  const tied = WITH_GRADIENTS.map((f) => f.meta.createOptions.tieWordEmbeddings);
  expect(new Set(tied)).toEqual(new Set([true, false]));
  for (const f of WITH_GRADIENTS) expect(f.meta.tokens_c!.length).toBeGreaterThan(128);
});

test.each(WITH_GRADIENTS.map((f) => [f.name, f] as const))(
  "%s: one training step on the packed sequences has transformers' gradients",
  async (_, { dir, meta }) => {
    const hf = loadHfModel(dir);
    const model = await loadModel(hf.config, hf.tensors);
    const seqs = fixtureSequences(meta);
    const row = {
      inputIds: seqs.flat(),
      positionIds: seqs.flatMap((s) => s.map((_, i) => i)),
      lossMask: seqs.flatMap((s) => s.map((_, i) => (i > 0 ? 1 : 0))),
    };
    const { gradients, metrics } = await model.createTrainer({ weightDecay: 0 }).gradients([row], { kind: 'ce' });
    expect(metrics.loss).toBeCloseTo(meta.grads!.loss, 5);
    const reference = new Map(readSafetensors(path.join(dir, 'grads.safetensors')).tensors.map((t) => [t.name, t]));
    expect(gradients.map((g) => g.name).sort()).toEqual([...reference.keys()].sort());
    for (const g of gradients) {
      const ours = decode(g);
      const theirs = decode(reference.get(g.name)! as WeightTensor);
      let diff = 0;
      let scale = 0;
      for (let i = 0; i < ours.length; i++) {
        diff = Math.max(diff, Math.abs(ours[i] - theirs[i]));
        scale = Math.max(scale, Math.abs(theirs[i]));
      }
      // Relative to the tensor's largest entry: fp32 sums in another order.
      if (diff > 1e-4 * scale) throw new Error(`${g.name}: max |diff| ${diff} vs max |grad| ${scale}`);
    }
  },
);

/**
 * The native engine against Hugging Face transformers itself: logits that transformers computed
 * (fp32, by scripts/check_hf_compat.py --write-fixtures) for every fixture folder (small Llama,
 * Qwen2, Qwen3 and Qwen3-MoE models, and MoE variants such as decoder_sparse_step 2) with perturbed
 * norms and biases, so every weight matters. Both sequences go in one packed row.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { loadModel } from '../lib/model/engine';
import { loadHfModel } from '../lib/model/hf';
import { HF_FIXTURES } from './support/hf-fixtures';

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
    const ids = [...meta.tokens_a, ...meta.tokens_b];
    const positions = [...meta.tokens_a.map((_, i) => i), ...meta.tokens_b.map((_, i) => i)];
    const [scores] = await model.score([{ inputIds: ids, positionIds: positions }]);
    let worst = 0;
    let offset = 0;
    for (const seq of [meta.tokens_a, meta.tokens_b]) {
      for (let t = 1; t < seq.length; t++) {
        // HF row t-1 of this sequence predicts token t.
        const row = logits.subarray((offset + t - 1) * meta.vocab_size, (offset + t) * meta.vocab_size);
        const expected = logSoftmax(row)[seq[t]];
        worst = Math.max(worst, Math.abs(scores.logprobs[offset + t] - expected));
      }
      offset += seq.length;
    }
    // Logits here are O(10) (weights x10); measured worst difference is 4e-6, the last bits of fp32.
    expect(worst).toBeLessThan(1e-5);
  },
);

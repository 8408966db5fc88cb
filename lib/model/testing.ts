/**
 * Seeded random models for the native engine's tests and benchmarks (not used by the runtime): HF-named tensors for any
 * ArchConfig, with values large enough that the model's distributions are far from uniform.
 */
import type { Arch, ArchConfig, TensorDType, WeightTensor } from './arch';
import { family } from './families';
import { defaultLayerTypes } from './families/qwen3_5';
import { Rng } from './rng';
import { tensorSpecs } from './tensors';
import type { GeneratorOptions, NativeModel } from '../../native';

/** A small config of the given architecture (hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 300). */
export function tinyConfig(arch: Arch, overrides: Partial<ArchConfig> = {}): ArchConfig {
  const c: ArchConfig = {
    arch,
    vocabSize: 300,
    hiddenSize: 64,
    intermediateSize: 128,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    rmsNormEps: 1e-6,
    ropeTheta: 10000,
    maxPositionEmbeddings: 512,
    tieWordEmbeddings: arch === 'qwen3',
    ...family(arch).defaults,
    ...overrides,
  };
  // A hybrid family's blocks: transformers' every-4th-full rule, at least one full block.
  if (c.linearAttention && !c.layerTypes) c.layerTypes = defaultLayerTypes(c.numLayers, Math.min(4, c.numLayers));
  return c;
}

/** Encodes float values as little-endian bytes of `dtype` (F16/BF16 round to nearest even). */
export function encode(values: Float64Array, dtype: TensorDType): Buffer {
  const n = values.length;
  switch (dtype) {
    case 'F64':
      return Buffer.from(new Float64Array(values).buffer);
    case 'F32':
      return Buffer.from(new Float32Array(values).buffer);
    case 'BF16': {
      const f = new Float32Array(values),
        u = new Uint32Array(f.buffer),
        out = new Uint16Array(n);
      for (let i = 0; i < n; i++) out[i] = (u[i] + 0x7fff + ((u[i] >>> 16) & 1)) >>> 16;
      return Buffer.from(out.buffer);
    }
    case 'F16': {
      const out = new Uint16Array(n),
        f = new Float32Array(1),
        u = new Uint32Array(f.buffer);
      for (let i = 0; i < n; i++) {
        f[0] = values[i];
        const x = u[0],
          sign = (x >>> 16) & 0x8000,
          exp = ((x >>> 23) & 0xff) - 127 + 15;
        // Test values are small normals: no overflow/subnormal handling needed beyond flushing.
        out[i] = exp <= 0 ? sign : sign | (exp << 10) | ((x >>> 13) & 0x3ff);
      }
      return Buffer.from(out.buffer);
    }
  }
}

/** Decodes little-endian F32/F64/BF16 bytes to numbers. */
export function decode(t: WeightTensor): Float64Array {
  const b = t.data;
  if (t.dtype === 'F64')
    return new Float64Array(new Float64Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length)));
  if (t.dtype === 'F32')
    return new Float64Array(new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length)));
  if (t.dtype === 'BF16') {
    const u16 = new Uint16Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    const u32 = new Uint32Array(u16.length);
    for (let i = 0; i < u16.length; i++) u32[i] = u16[i] << 16;
    return new Float64Array(new Float32Array(u32.buffer));
  }
  throw new Error(`decode: unsupported dtype ${t.dtype}`);
}

/**
 * Random weights for `c`: linears N(0, 1/sqrt(fan_in)) (embeddings N(0, 0.3)), norms 1 + N(0, 0.1)
 * (norms stored as offsets from 1: N(0, 0.1)), biases N(0, 0.1), Gated DeltaNet's dt_bias 1 + N(0,
 * 0.1) and A_log log(U(0.01, 0.1)) (slow decay: the state matters across chunks), encoded in `dtype`.
 */
export function randomWeights(c: ArchConfig, seed: number, dtype: TensorDType = 'F32'): WeightTensor[] {
  const rng = new Rng(seed);
  return tensorSpecs(c).map(({ name, shape, role }) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const v = new Float64Array(n);
    const fanIn = shape.slice(1).reduce((a, b) => a * b, 1);
    for (let i = 0; i < n; i++) {
      if (role === 'decayLog') v[i] = Math.log(0.01 + 0.09 * rng.uniform());
      else if (role === 'norm' || role === 'ones') v[i] = 1 + 0.1 * rng.normal();
      else if (role === 'normOffset' || role === 'bias') v[i] = 0.1 * rng.normal();
      else v[i] = (role === 'embedding' ? 0.3 : 1 / Math.sqrt(fanIn)) * rng.normal();
    }
    return { name, dtype, shape, data: encode(v, dtype) };
  });
}

/** Random token ids in [0, vocab). */
export function randomTokens(rng: Rng, n: number, vocab: number): number[] {
  return Array.from({ length: n }, () => rng.int(vocab));
}

/** Packs samples into one row with positions restarting at 0 per sample. */
export function packRow(samples: number[][]): { inputIds: number[]; positionIds: number[] } {
  return {
    inputIds: samples.flat(),
    positionIds: samples.flatMap((s) => s.map((_, i) => i)),
  };
}

/**
 * Greedy decoding of `prompts` side by side through the model's generator (`opts` sizes it):
 * each prompt's tokens and their logprobs.
 */
export async function greedyDecode(
  model: NativeModel,
  prompts: number[][],
  maxTokens: number,
  opts: GeneratorOptions,
): Promise<{ tokens: number[][]; logprobs: number[][] }> {
  const gen = model.createGenerator(opts);
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

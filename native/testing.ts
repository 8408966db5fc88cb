/**
 * Seeded random models for the native engine's tests and benchmarks: HF-named tensors for any
 * ArchConfig, with values large enough that the model's distributions are far from uniform.
 */
import type { Arch, ArchConfig } from '../lib/model/arch';
import type { TensorDType, WeightTensor } from './index';

/** Deterministic PRNG (mulberry32) with Box-Muller normals. */
export class SeededRng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  uniform(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  normal(): number {
    const u = 1 - this.uniform();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * this.uniform());
  }
  int(n: number): number {
    return Math.floor(this.uniform() * n);
  }
}

/** A small config of the given architecture (hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 300). */
export function tinyConfig(arch: Arch, overrides: Partial<ArchConfig> = {}): ArchConfig {
  return {
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
    attentionBias: arch === 'qwen2',
    qkNorm: arch === 'qwen3',
    ...overrides,
  };
}

/** Name and shape of every tensor the engine expects for `c`, in HF order. */
export function weightShapes(c: ArchConfig): Array<{ name: string; shape: number[] }> {
  const D = c.hiddenSize, I = c.intermediateSize, qd = c.numHeads * c.headDim, kvd = c.numKvHeads * c.headDim;
  const out = [{ name: 'model.embed_tokens.weight', shape: [c.vocabSize, D] }];
  for (let i = 0; i < c.numLayers; i++) {
    const p = `model.layers.${i}.`;
    out.push({ name: p + 'input_layernorm.weight', shape: [D] });
    for (const [n, rows] of [['q', qd], ['k', kvd], ['v', kvd]] as const) {
      out.push({ name: `${p}self_attn.${n}_proj.weight`, shape: [rows, D] });
      if (c.attentionBias) out.push({ name: `${p}self_attn.${n}_proj.bias`, shape: [rows] });
    }
    out.push({ name: p + 'self_attn.o_proj.weight', shape: [D, qd] });
    if (c.attentionBias && c.arch === 'llama') out.push({ name: p + 'self_attn.o_proj.bias', shape: [D] });
    if (c.qkNorm) {
      out.push({ name: p + 'self_attn.q_norm.weight', shape: [c.headDim] });
      out.push({ name: p + 'self_attn.k_norm.weight', shape: [c.headDim] });
    }
    out.push({ name: p + 'post_attention_layernorm.weight', shape: [D] });
    out.push({ name: p + 'mlp.gate_proj.weight', shape: [I, D] });
    out.push({ name: p + 'mlp.up_proj.weight', shape: [I, D] });
    out.push({ name: p + 'mlp.down_proj.weight', shape: [D, I] });
  }
  out.push({ name: 'model.norm.weight', shape: [D] });
  if (!c.tieWordEmbeddings) out.push({ name: 'lm_head.weight', shape: [c.vocabSize, D] });
  return out;
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
      const f = new Float32Array(values), u = new Uint32Array(f.buffer), out = new Uint16Array(n);
      for (let i = 0; i < n; i++) out[i] = (u[i] + 0x7fff + ((u[i] >>> 16) & 1)) >>> 16;
      return Buffer.from(out.buffer);
    }
    case 'F16': {
      const out = new Uint16Array(n), f = new Float32Array(1), u = new Uint32Array(f.buffer);
      for (let i = 0; i < n; i++) {
        f[0] = values[i];
        const x = u[0], sign = (x >>> 16) & 0x8000, exp = ((x >>> 23) & 0xff) - 127 + 15;
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
  if (t.dtype === 'F64') return new Float64Array(new Float64Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length)));
  if (t.dtype === 'F32') return new Float64Array(new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length)));
  if (t.dtype === 'BF16') {
    const u16 = new Uint16Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.length));
    const u32 = new Uint32Array(u16.length);
    for (let i = 0; i < u16.length; i++) u32[i] = u16[i] << 16;
    return new Float64Array(new Float32Array(u32.buffer));
  }
  throw new Error(`decode: unsupported dtype ${t.dtype}`);
}

/**
 * Random weights for `c`: linears N(0, 1/sqrt(fan_in)) (embeddings N(0, 0.3)), norms 1 + N(0, 0.1),
 * biases N(0, 0.1), encoded in `dtype`.
 */
export function randomWeights(c: ArchConfig, seed: number, dtype: TensorDType = 'F32'): WeightTensor[] {
  const rng = new SeededRng(seed);
  return weightShapes(c).map(({ name, shape }) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const v = new Float64Array(n);
    const isNorm = name.endsWith('norm.weight'), isBias = name.endsWith('.bias');
    const std = isNorm || isBias ? 0.1 : name.includes('embed') ? 0.3 : 1 / Math.sqrt(shape[1]);
    for (let i = 0; i < n; i++) v[i] = (isNorm ? 1 : 0) + std * rng.normal();
    return { name, dtype, shape, data: encode(v, dtype) };
  });
}

/** Random token ids in [0, vocab). */
export function randomTokens(rng: SeededRng, n: number, vocab: number): number[] {
  return Array.from({ length: n }, () => rng.int(vocab));
}

/** Packs samples into one row with positions restarting at 0 per sample. */
export function packRow(samples: number[][]): { inputIds: number[]; positionIds: number[] } {
  return {
    inputIds: samples.flat(),
    positionIds: samples.flatMap((s) => s.map((_, i) => i)),
  };
}

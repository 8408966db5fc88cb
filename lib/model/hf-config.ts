/**
 * Mapping between a Hugging Face `config.json` and our `ArchConfig`, both ways. Reading is strict:
 * a field the native engine would silently ignore (rope scaling, sliding windows, MLP biases, other
 * activations) is an error naming the field, because serving such a model would give wrong logits.
 */
import type { ArchConfig, MoeConfig } from './arch';
import { ConfigReader, type Json } from './config-reader';
import { ARCHS, type Arch } from '../config/names';
import { FAMILIES, family } from './families';

const ARCH_BY_CLASS = new Map(ARCHS.map((a) => [FAMILIES[a].hfClass, a]));

/** The config.json field each ArchConfig fact comes from (MoE ones flattened out of `moe`), for messages. */
export const HF_FIELDS: Record<Exclude<keyof ArchConfig, 'moe'> | keyof MoeConfig, string> = {
  arch: 'model_type',
  vocabSize: 'vocab_size',
  hiddenSize: 'hidden_size',
  intermediateSize: 'intermediate_size',
  numLayers: 'num_hidden_layers',
  numHeads: 'num_attention_heads',
  numKvHeads: 'num_key_value_heads',
  headDim: 'head_dim',
  rmsNormEps: 'rms_norm_eps',
  ropeTheta: 'rope_theta',
  maxPositionEmbeddings: 'max_position_embeddings',
  tieWordEmbeddings: 'tie_word_embeddings',
  attentionBias: 'attention_bias',
  qkNorm: 'model_type', // q/k norms come with the family
  numExperts: 'num_experts',
  numExpertsPerTok: 'num_experts_per_tok',
  moeIntermediateSize: 'moe_intermediate_size',
  decoderSparseStep: 'decoder_sparse_step',
  mlpOnlyLayers: 'mlp_only_layers',
  normTopkProb: 'norm_topk_prob',
  sharedExpertIntermediateSize: 'shared_expert_intermediate_size',
  layerTypes: 'layer_types',
  linearAttention: 'linear_num_key_heads', // with the other linear_* sizes
  partialRotaryFactor: 'partial_rotary_factor',
  normOffset: 'model_type', // Qwen3.5's norm convention comes with the family
  attnOutputGate: 'model_type', // so does its gated attention
};

/** Defaults of the transformers config classes for absent fields (the family-specific ones are in `families/`). */
const DEFAULT_ROPE_THETA = 10000;
const DEFAULT_RMS_EPS = 1e-6;

function readArch(r: ConfigReader, raw: Json): Arch {
  const modelType = raw.model_type;
  const archs = raw.architectures;
  let arch: Arch | undefined;
  if (archs !== undefined && archs !== null) {
    if (!Array.isArray(archs) || archs.length === 0 || typeof archs[0] !== 'string') {
      r.fail('architectures', 'must be a non-empty array of class names');
    }
    arch = ARCH_BY_CLASS.get(archs[0]);
    if (!arch)
      r.fail(
        'architectures',
        `names unsupported class ${JSON.stringify(archs[0])} (supported: ${[...ARCH_BY_CLASS.keys()].join(', ')})`,
      );
  }
  if (modelType !== undefined && modelType !== null) {
    if (typeof modelType !== 'string' || !(ARCHS as readonly string[]).includes(modelType)) {
      r.fail('model_type', `is unsupported: ${JSON.stringify(modelType)} (supported: ${ARCHS.join(', ')})`);
    }
    if (arch && arch !== modelType)
      r.fail('model_type', `is '${modelType}' but architectures names ${FAMILIES[arch].hfClass}`);
    arch = modelType as Arch;
  }
  if (!arch) r.fail('architectures', 'and model_type are both missing');
  return arch;
}

/**
 * RoPE theta from either the transformers v4 layout (`rope_theta`, `rope_scaling`) or the v5 one
 * (`rope_parameters: {rope_type, rope_theta}`). Only plain RoPE is implemented by the engine.
 */
function readRope(r: ConfigReader, raw: Json): number {
  const params = raw.rope_parameters;
  if (params !== undefined && params !== null) {
    if (typeof params !== 'object' || Array.isArray(params)) r.fail('rope_parameters', 'must be an object');
    const p = params as Json;
    if (p.rope_type !== undefined && p.rope_type !== 'default') {
      r.fail('rope_parameters.rope_type', `is ${JSON.stringify(p.rope_type)}; only 'default' RoPE is supported`);
    }
    if (p.rope_theta !== undefined)
      return r.posNumber('rope_theta', DEFAULT_ROPE_THETA, p, 'rope_parameters.rope_theta');
  }
  const scaling = raw.rope_scaling;
  if (scaling !== undefined && scaling !== null) {
    const type = (scaling as Json).rope_type ?? (scaling as Json).type;
    if (type !== 'default') r.fail('rope_scaling', `is ${JSON.stringify(scaling)}; only plain RoPE is supported`);
  }
  return r.posNumber('rope_theta', DEFAULT_ROPE_THETA);
}

/** Parses a `config.json` object; `source` (its path) is named in every error. */
export function parseHfConfig(raw: unknown, source = 'config.json'): ArchConfig {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new Error(`${source}: not a JSON object`);
  const top = raw as Json;
  const arch = readArch(new ConfigReader(top, source), top);
  const fam = FAMILIES[arch];
  // The Hub's multimodal checkpoints keep the text model's fields in a sub-object.
  const { raw: json, source: textSource } = fam.nested ? fam.nested.read(top, source) : { raw: top, source };
  const r = new ConfigReader(json, textSource);

  const hiddenSize = r.posInt('hidden_size');
  const numHeads = r.posInt('num_attention_heads');
  const numKvHeads = r.posInt('num_key_value_heads', numHeads);
  if (numHeads % numKvHeads !== 0)
    r.fail('num_key_value_heads', `(${numKvHeads}) must divide num_attention_heads (${numHeads})`);
  if (!r.has('head_dim') && hiddenSize % numHeads !== 0) {
    r.fail(
      'head_dim',
      `is absent and hidden_size (${hiddenSize}) is not divisible by num_attention_heads (${numHeads})`,
    );
  }
  const headDim = r.posInt('head_dim', hiddenSize / numHeads);

  const act = json.hidden_act ?? 'silu';
  if (act !== 'silu') r.fail('hidden_act', `is ${JSON.stringify(act)}; only 'silu' (SwiGLU) is supported`);
  if (r.bool('mlp_bias', false)) r.fail('mlp_bias', 'is true; MLP biases are not supported');
  const { intermediateSize: mlpWidth, ...features } = fam.readFeatures(r);

  return {
    arch,
    vocabSize: r.posInt('vocab_size'),
    hiddenSize,
    intermediateSize: r.posInt('intermediate_size', mlpWidth),
    numLayers: r.posInt('num_hidden_layers'),
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: r.posNumber('rms_norm_eps', DEFAULT_RMS_EPS),
    ropeTheta: readRope(r, json),
    maxPositionEmbeddings: r.posInt('max_position_embeddings', fam.defaultMaxPositions),
    tieWordEmbeddings: r.bool('tie_word_embeddings', false),
    ...features,
  };
}

export interface SpecialTokenIds {
  bos: number;
  eos: number;
  pad: number;
}

/**
 * A complete `config.json` for transformers (v4 field names, which v5 still reads) describing `a`.
 * `torch_dtype` is the dtype the weights are stored in.
 */
export function toHfConfig(a: ArchConfig, tokens: SpecialTokenIds, torchDtype: 'float32' | 'bfloat16'): Json {
  const fam = family(a.arch);
  if (a.moe && !fam.defaults.moe) throw new Error(`${a.arch} has no MoE blocks, but moe is set`);
  const own = fam.hfFields(a);
  const common: Json = {
    architectures: [fam.hfClass],
    model_type: a.arch,
    vocab_size: a.vocabSize,
    hidden_size: a.hiddenSize,
    intermediate_size: a.intermediateSize,
    num_hidden_layers: a.numLayers,
    num_attention_heads: a.numHeads,
    num_key_value_heads: a.numKvHeads,
    head_dim: a.headDim,
    hidden_act: 'silu',
    max_position_embeddings: a.maxPositionEmbeddings,
    initializer_range: 0.02,
    rms_norm_eps: a.rmsNormEps,
    rope_theta: a.ropeTheta,
    rope_scaling: null,
    attention_dropout: 0.0,
    tie_word_embeddings: a.tieWordEmbeddings,
    use_cache: true,
    bos_token_id: tokens.bos,
    eos_token_id: tokens.eos,
    pad_token_id: tokens.pad,
    torch_dtype: torchDtype,
  };
  const text = { ...common, ...own };
  return fam.nested ? fam.nested.write(text) : text;
}

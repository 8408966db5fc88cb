/**
 * Qwen3.5 (transformers' `qwen3_5`): a hybrid decoder whose blocks are, by `layer_types`, Gated
 * DeltaNet (`linear_attention`: linear attention with a recurrent state, three blocks in four in the
 * released models) or gated full attention (`full_attention`: q_proj yields each head's query and
 * an output gate, q/k norms, RoPE on the first `partial_rotary_factor` of each head). Its RMSNorms
 * store their weights as offsets from 1 (out = x / rms(x) * (1 + w); the Gated DeltaNet's own
 * gated norm excepted), so a new model's norm weights are zeros.
 *
 * Two families share it: `qwen3_5_text` (Qwen3_5ForCausalLM, the text model alone) and `qwen3_5`
 * (Qwen3_5ForConditionalGeneration, the Hub's checkpoints): its config.json nests the text model's
 * fields under `text_config`, its text weights sit under `model.language_model.`, and its vision
 * tower (`model.visual.`) is not used by a text run (lib/model/tensors.ts `isIgnorable`).
 * Qwen3.5-MoE (`qwen3_5_moe.ts`) has these blocks with sparse MLPs.
 */
import { LAYER_TYPES, type ArchConfig, type LayerType, type LinearAttentionConfig } from '../arch';
import type { ConfigReader, Json } from '../config-reader';
import type { AddLayerTensor, Family, FamilyFeatures, TensorSpec } from './decoder';

/** transformers' Qwen3_5TextConfig defaults for absent fields. */
const HF_LINEAR_DEFAULTS: LinearAttentionConfig = {
  numKeyHeads: 16,
  numValueHeads: 32,
  keyHeadDim: 128,
  valueHeadDim: 128,
  convKernel: 4,
};
const HF_PARTIAL_ROTARY = 0.25;
const HF_FULL_ATTENTION_INTERVAL = 4;

/** `model create`'s Gated DeltaNet sizes for the tiny preset (create.ts scales them for `small`). */
export const TINY_LINEAR_ATTENTION: LinearAttentionConfig = {
  numKeyHeads: 2,
  numValueHeads: 4,
  keyHeadDim: 16,
  valueHeadDim: 16,
  convKernel: 4,
};

/** transformers' default pattern: every `interval`-th block is full attention, the others linear. */
export function defaultLayerTypes(numLayers: number, interval = HF_FULL_ATTENTION_INTERVAL): LayerType[] {
  return Array.from({ length: numLayers }, (_, i) =>
    (i + 1) % interval === 0 ? 'full_attention' : 'linear_attention',
  );
}

function readLayerTypes(r: ConfigReader, numLayers: number): LayerType[] {
  if (!r.has('layer_types')) {
    const interval = r.posInt('full_attention_interval', HF_FULL_ATTENTION_INTERVAL);
    return defaultLayerTypes(numLayers, interval);
  }
  const v = r.raw.layer_types;
  if (!Array.isArray(v)) r.fail('layer_types', `must be an array of block kinds, got ${JSON.stringify(v)}`);
  const bad = v.findIndex((t) => !(LAYER_TYPES as readonly unknown[]).includes(t));
  if (bad >= 0)
    r.fail(
      'layer_types',
      `has an unknown entry ${JSON.stringify(v[bad])} at index ${bad} (known: ${LAYER_TYPES.join(', ')})`,
    );
  if (v.length !== numLayers) r.fail('layer_types', `has ${v.length} entries for num_hidden_layers ${numLayers}`);
  return v as LayerType[];
}

function readLinear(r: ConfigReader): LinearAttentionConfig {
  const d = HF_LINEAR_DEFAULTS;
  const lin: LinearAttentionConfig = {
    numKeyHeads: r.posInt('linear_num_key_heads', d.numKeyHeads),
    numValueHeads: r.posInt('linear_num_value_heads', d.numValueHeads),
    keyHeadDim: r.posInt('linear_key_head_dim', d.keyHeadDim),
    valueHeadDim: r.posInt('linear_value_head_dim', d.valueHeadDim),
    convKernel: r.posInt('linear_conv_kernel_dim', d.convKernel),
  };
  if (lin.numValueHeads % lin.numKeyHeads !== 0)
    r.fail(
      'linear_num_value_heads',
      `(${lin.numValueHeads}) must be a multiple of linear_num_key_heads (${lin.numKeyHeads})`,
    );
  return lin;
}

/**
 * `partial_rotary_factor` from `rope_parameters` (transformers v5) or the top level (v4), and the
 * multimodal RoPE settings, which for text-only input (equal positions on the three axes) reduce
 * to plain RoPE.
 */
function readPartialRotary(r: ConfigReader): number {
  const params = r.raw.rope_parameters;
  const p = params !== null && typeof params === 'object' && !Array.isArray(params) ? (params as Json) : {};
  const f = r.posNumber(
    'partial_rotary_factor',
    r.posNumber('partial_rotary_factor', HF_PARTIAL_ROTARY),
    p,
    'rope_parameters.partial_rotary_factor',
  );
  if (f > 1) r.fail('partial_rotary_factor', `(${f}) must be in (0, 1]`);
  return f;
}

/** The Qwen3.5 features of config.json's text fields (shared with qwen3_5_moe). */
export function readHybridFeatures(r: ConfigReader): FamilyFeatures {
  if (r.bool('attention_bias', false)) r.fail('attention_bias', 'is true; Qwen3.5 attention biases are not supported');
  const numLayers = r.posInt('num_hidden_layers');
  const partialRotaryFactor = readPartialRotary(r);
  // transformers' default head_dim (256) is not hidden_size / num_attention_heads: no default here.
  const headDim = r.posInt('head_dim');
  if (Math.floor(headDim * partialRotaryFactor) % 2 !== 0)
    r.fail(
      'partial_rotary_factor',
      `rotates ${headDim * partialRotaryFactor} dims of head_dim ${headDim}; RoPE needs an even count`,
    );
  return {
    attentionBias: false,
    qkNorm: true,
    layerTypes: readLayerTypes(r, numLayers),
    linearAttention: readLinear(r),
    partialRotaryFactor,
    normOffset: true,
    attnOutputGate: true,
  };
}

/** Rejects an ArchConfig a Qwen3.5 config.json could not express. */
export function checkHybrid(a: ArchConfig): { layerTypes: LayerType[]; lin: LinearAttentionConfig } {
  if (!a.qkNorm) throw new Error(`qkNorm is false but ${a.arch} always has q/k norms`);
  if (a.attentionBias) throw new Error(`${a.arch} has no attention biases (attentionBias must be false)`);
  if (!a.normOffset || !a.attnOutputGate)
    throw new Error(`${a.arch} needs normOffset and attnOutputGate (its norms and gated attention)`);
  const layerTypes = a.layerTypes ?? [];
  if (layerTypes.length !== a.numLayers)
    throw new Error(`layerTypes has ${layerTypes.length} entries for ${a.numLayers} layers`);
  const lin = a.linearAttention;
  if (!lin) throw new Error(`${a.arch} needs linearAttention sizes`);
  for (const k of Object.keys(HF_LINEAR_DEFAULTS) as (keyof LinearAttentionConfig)[])
    if (!Number.isSafeInteger(lin[k]) || lin[k] <= 0)
      throw new Error(`linearAttention.${k} must be a positive integer, got ${lin[k]}`);
  if (lin.numValueHeads % lin.numKeyHeads !== 0)
    throw new Error(`linearAttention.numValueHeads (${lin.numValueHeads}) must be a multiple of numKeyHeads`);
  const f = a.partialRotaryFactor ?? 1;
  if (!(f > 0 && f <= 1) || Math.floor(a.headDim * f) % 2 !== 0)
    throw new Error(`partialRotaryFactor ${f} must rotate an even number of the ${a.headDim} head dims`);
  return { layerTypes, lin };
}

/** The text model's own config.json fields (beside the common ones of hf-config.ts). */
export function hybridFields(a: ArchConfig): Json {
  const { layerTypes, lin } = checkHybrid(a);
  return {
    attention_bias: false,
    layer_types: layerTypes,
    linear_num_key_heads: lin.numKeyHeads,
    linear_num_value_heads: lin.numValueHeads,
    linear_key_head_dim: lin.keyHeadDim,
    linear_value_head_dim: lin.valueHeadDim,
    linear_conv_kernel_dim: lin.convKernel,
    // v5's layout, which holds the partial rotary factor; the common rope_theta stays for v4 readers.
    rope_parameters: {
      rope_type: 'default',
      rope_theta: a.ropeTheta,
      partial_rotary_factor: a.partialRotaryFactor ?? 1,
    },
  };
}

/**
 * The tensors of a Qwen3.5 decoder under `prefix` (`model.` or `model.language_model.`), the MLP
 * of block i given by `mlp` (a dense SwiGLU, or Qwen3.5-MoE's sparse block).
 */
export function hybridTensors(
  a: ArchConfig,
  prefix: string,
  mlp: (i: number, add: AddLayerTensor) => void,
): TensorSpec[] {
  const { layerTypes, lin } = checkHybrid(a);
  const D = a.hiddenSize;
  const keyDim = lin.numKeyHeads * lin.keyHeadDim;
  const valueDim = lin.numValueHeads * lin.valueHeadDim;
  const convDim = 2 * keyDim + valueDim;
  const q = a.numHeads * a.headDim;
  const kv = a.numKvHeads * a.headDim;
  const specs: TensorSpec[] = [
    { name: `${prefix}embed_tokens.weight`, shape: [a.vocabSize, D], role: 'embedding', slot: 'embed', layer: -1 },
  ];
  for (let i = 0; i < a.numLayers; i++) {
    const p = `${prefix}layers.${i}`;
    const add: AddLayerTensor = (suffix, shape, role, slot, expert) =>
      specs.push({ name: `${p}.${suffix}`, shape, role, slot, layer: i, ...(expert === undefined ? {} : { expert }) });
    add('input_layernorm.weight', [D], 'normOffset', 'inputNorm');
    if (layerTypes[i] === 'linear_attention') {
      add('linear_attn.in_proj_qkv.weight', [convDim, D], 'linear', 'linQkv');
      add('linear_attn.in_proj_z.weight', [valueDim, D], 'linear', 'linZ');
      add('linear_attn.in_proj_b.weight', [lin.numValueHeads, D], 'linear', 'linB');
      add('linear_attn.in_proj_a.weight', [lin.numValueHeads, D], 'linear', 'linA');
      add('linear_attn.conv1d.weight', [convDim, 1, lin.convKernel], 'linear', 'linConv');
      add('linear_attn.dt_bias', [lin.numValueHeads], 'ones', 'linDtBias');
      add('linear_attn.A_log', [lin.numValueHeads], 'decayLog', 'linALog');
      add('linear_attn.norm.weight', [lin.valueHeadDim], 'norm', 'linNorm');
      add('linear_attn.out_proj.weight', [D, valueDim], 'linear', 'linOut');
    } else {
      add('self_attn.q_proj.weight', [2 * q, D], 'linear', 'q'); // per head: query, then gate
      add('self_attn.k_proj.weight', [kv, D], 'linear', 'k');
      add('self_attn.v_proj.weight', [kv, D], 'linear', 'v');
      add('self_attn.q_norm.weight', [a.headDim], 'normOffset', 'qNorm');
      add('self_attn.k_norm.weight', [a.headDim], 'normOffset', 'kNorm');
      add('self_attn.o_proj.weight', [D, q], 'linear', 'o');
    }
    add('post_attention_layernorm.weight', [D], 'normOffset', 'postNorm');
    mlp(i, add);
  }
  specs.push({ name: `${prefix}norm.weight`, shape: [D], role: 'normOffset', slot: 'norm', layer: -1 });
  if (!a.tieWordEmbeddings)
    specs.push({ name: 'lm_head.weight', shape: [a.vocabSize, D], role: 'linear', slot: 'lmHead', layer: -1 });
  return specs;
}

const denseMlp = (a: ArchConfig) => (_i: number, add: AddLayerTensor) => {
  add('mlp.gate_proj.weight', [a.intermediateSize, a.hiddenSize], 'linear', 'gate');
  add('mlp.up_proj.weight', [a.intermediateSize, a.hiddenSize], 'linear', 'up');
  add('mlp.down_proj.weight', [a.hiddenSize, a.intermediateSize], 'linear', 'down');
};

/** A new model's hybrid features (`model create`; create.ts sets the layer types by its layer count). */
export const HYBRID_DEFAULTS: FamilyFeatures = {
  attentionBias: false,
  qkNorm: true,
  linearAttention: TINY_LINEAR_ATTENTION,
  partialRotaryFactor: HF_PARTIAL_ROTARY,
  normOffset: true,
  attnOutputGate: true,
};

/**
 * The Hub's nesting: the text model's fields under `text_config` (the top level's
 * `tie_word_embeddings` wins, as transformers ties by it), and a vision tower's under
 * `vision_config`, which a text run keeps as it is but does not read.
 */
export const TEXT_CONFIG_NESTING: NonNullable<Family['nested']> = {
  read(raw, source) {
    const text = raw.text_config;
    if (text === null || typeof text !== 'object' || Array.isArray(text))
      throw new Error(`${source}: field 'text_config' must be an object (the text model's config)`);
    const t = text as Json;
    const tie = raw.tie_word_embeddings ?? t.tie_word_embeddings;
    return {
      raw: { ...t, model_type: raw.model_type, architectures: raw.architectures, tie_word_embeddings: tie },
      source: `${source} (text_config)`,
    };
  },
  write(text) {
    const { architectures, model_type, tie_word_embeddings, torch_dtype, ...rest } = text;
    return {
      architectures,
      model_type,
      text_config: { ...rest, model_type: `${String(model_type)}_text` },
      // A new model has no vision weights; this tiny tower keeps transformers' random one small.
      vision_config: {
        depth: 1,
        hidden_size: 16,
        intermediate_size: 32,
        num_heads: 2,
        out_hidden_size: rest.hidden_size,
        patch_size: 2,
        temporal_patch_size: 2,
        spatial_merge_size: 1,
        num_position_embeddings: 16,
      },
      tie_word_embeddings,
      torch_dtype,
    };
  },
};

export const qwen3_5_text: Family = {
  modelType: 'qwen3_5_text',
  hfClass: 'Qwen3_5ForCausalLM',
  defaultMaxPositions: 32768,
  defaults: HYBRID_DEFAULTS,
  readFeatures: readHybridFeatures,
  hfFields: hybridFields,
  tensors: (a) => hybridTensors(a, 'model.', denseMlp(a)),
};

/**
 * The Hub's multimodal layout of a Qwen3.5 text family (`<type>` for `<type>_text`): config.json
 * nests the text fields under `text_config`, the text weights sit under `model.language_model.`.
 */
export function multimodalFamily(
  text: Family,
  hfClass: string,
  mlp: (a: ArchConfig) => (i: number, add: AddLayerTensor) => void,
): Family {
  return {
    ...text,
    modelType: text.modelType.replace(/_text$/, ''),
    hfClass,
    nested: TEXT_CONFIG_NESTING,
    tensors: (a) => hybridTensors(a, 'model.language_model.', mlp(a)),
  };
}

export const qwen3_5 = multimodalFamily(qwen3_5_text, 'Qwen3_5ForConditionalGeneration', denseMlp);

/**
 * Qwen3.5-MoE (transformers' `qwen3_5_moe`, e.g. Qwen3.6-35B-A3B): Qwen3.5's hybrid blocks
 * (`qwen3_5.ts`) with a sparse MLP in every block: a router `mlp.gate` [experts, D] sending each
 * token to its top `num_experts_per_tok` experts (softmax, top-k, always renormalised), the
 * experts `mlp.experts.<e>.{gate,up,down}_proj` of width `moe_intermediate_size` (transformers
 * fuses them in memory and saves them per expert), and a shared expert
 * `mlp.shared_expert.{gate,up,down}_proj` of width `shared_expert_intermediate_size` that every
 * token goes through, scaled by sigmoid(`mlp.shared_expert_gate` x). Its config has no dense MLP
 * width: `intermediateSize` holds the expert width. Like Qwen3.5, the text model alone
 * (`qwen3_5_moe_text`) or the Hub's multimodal layout (`qwen3_5_moe`).
 */
import type { ArchConfig, MoeConfig } from '../arch';
import type { ConfigReader } from '../config-reader';
import type { AddLayerTensor, Family } from './decoder';
import { HYBRID_DEFAULTS, hybridFields, hybridTensors, multimodalFamily, readHybridFeatures } from './qwen3_5';
import { checkMoe } from './qwen3_moe';

/** transformers' Qwen3_5MoeTextConfig defaults for absent fields. */
const HF_DEFAULTS = {
  numExperts: 256,
  numExpertsPerTok: 8,
  moeIntermediateSize: 512,
  sharedExpertIntermediateSize: 512,
};

function readMoe(r: ConfigReader): MoeConfig {
  const d = HF_DEFAULTS;
  const moe: MoeConfig = {
    numExperts: r.posInt('num_experts', d.numExperts),
    numExpertsPerTok: r.posInt('num_experts_per_tok', d.numExpertsPerTok),
    moeIntermediateSize: r.posInt('moe_intermediate_size', d.moeIntermediateSize),
    sharedExpertIntermediateSize: r.posInt('shared_expert_intermediate_size', d.sharedExpertIntermediateSize),
    decoderSparseStep: 1,
    mlpOnlyLayers: [],
    normTopkProb: true,
  };
  if (moe.numExpertsPerTok > moe.numExperts)
    r.fail('num_experts_per_tok', `(${moe.numExpertsPerTok}) exceeds num_experts (${moe.numExperts})`);
  for (const f of ['decoder_sparse_step', 'mlp_only_layers'])
    if (r.has(f)) r.fail(f, 'is not a Qwen3.5-MoE field: every block is sparse');
  return moe;
}

function checkQwen35Moe(a: ArchConfig): MoeConfig & { sharedExpertIntermediateSize: number } {
  const moe = checkMoe(a.moe, a.numLayers);
  if (moe.decoderSparseStep !== 1 || moe.mlpOnlyLayers.length > 0 || !moe.normTopkProb)
    throw new Error(`${a.arch}: every block is sparse (decoderSparseStep 1, no mlpOnlyLayers) and normTopkProb`);
  const shared = moe.sharedExpertIntermediateSize;
  if (shared === undefined || !Number.isSafeInteger(shared) || shared <= 0)
    throw new Error(`moe.sharedExpertIntermediateSize must be a positive integer, got ${shared}`);
  return { ...moe, sharedExpertIntermediateSize: shared };
}

const sparseMlp = (a: ArchConfig) => {
  const moe = checkQwen35Moe(a);
  const D = a.hiddenSize,
    I = moe.moeIntermediateSize,
    S = moe.sharedExpertIntermediateSize;
  return (_i: number, add: AddLayerTensor) => {
    add('mlp.gate.weight', [moe.numExperts, D], 'linear', 'router');
    for (let e = 0; e < moe.numExperts; e++) {
      add(`mlp.experts.${e}.gate_proj.weight`, [I, D], 'linear', 'expertGate', e);
      add(`mlp.experts.${e}.up_proj.weight`, [I, D], 'linear', 'expertUp', e);
      add(`mlp.experts.${e}.down_proj.weight`, [D, I], 'linear', 'expertDown', e);
    }
    add('mlp.shared_expert.gate_proj.weight', [S, D], 'linear', 'sharedGate');
    add('mlp.shared_expert.up_proj.weight', [S, D], 'linear', 'sharedUp');
    add('mlp.shared_expert.down_proj.weight', [D, S], 'linear', 'sharedDown');
    add('mlp.shared_expert_gate.weight', [1, D], 'linear', 'sharedExpertGate');
  };
};

export const qwen3_5_moe_text: Family = {
  modelType: 'qwen3_5_moe_text',
  hfClass: 'Qwen3_5MoeForCausalLM',
  defaultMaxPositions: 32768,
  // `model create`'s tiny preset; create.ts scales the experts for `small`.
  defaults: {
    ...HYBRID_DEFAULTS,
    moe: {
      numExperts: 8,
      numExpertsPerTok: 2,
      moeIntermediateSize: 96,
      sharedExpertIntermediateSize: 96,
      decoderSparseStep: 1,
      mlpOnlyLayers: [],
      normTopkProb: true,
    },
  },
  readFeatures: (r) => {
    const moe = readMoe(r);
    // No dense MLP: config.json's intermediate_size (absent on the Hub) is the experts' width.
    return { ...readHybridFeatures(r), moe, intermediateSize: moe.moeIntermediateSize };
  },
  hfFields: (a) => {
    const moe = checkQwen35Moe(a);
    return {
      ...hybridFields(a),
      num_experts: moe.numExperts,
      num_experts_per_tok: moe.numExpertsPerTok,
      moe_intermediate_size: moe.moeIntermediateSize,
      shared_expert_intermediate_size: moe.sharedExpertIntermediateSize,
      output_router_logits: false,
      router_aux_loss_coef: 0.001,
    };
  },
  tensors: (a) => hybridTensors(a, 'model.', sparseMlp(a)),
};

export const qwen3_5_moe = multimodalFamily(qwen3_5_moe_text, 'Qwen3_5MoeForConditionalGeneration', sparseMlp);

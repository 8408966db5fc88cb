/**
 * Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (q/k norms) with sparse mixture-of-experts
 * MLPs. A sparse block (`isSparseLayer`) has a router `mlp.gate` [experts, D] and experts
 * `mlp.experts.<e>.{gate,up,down}_proj` of width `moe_intermediate_size`; the others keep Qwen3's
 * dense MLP of width `intermediate_size`.
 */
import type { MoeConfig } from '../arch';
import type { ConfigReader } from '../config-reader';
import type { Family } from './decoder';
import { decoderTensors, fullAttentionFields, isSparseLayer, rejectSlidingWindow } from './decoder';

/** transformers' Qwen3MoeConfig defaults for absent fields. */
const HF_DEFAULTS: MoeConfig = {
  numExperts: 128,
  numExpertsPerTok: 8,
  moeIntermediateSize: 768,
  decoderSparseStep: 1,
  mlpOnlyLayers: [],
  normTopkProb: false,
};

function readMoe(r: ConfigReader): MoeConfig {
  const d = HF_DEFAULTS;
  // transformers v5 saves the expert count as `num_local_experts` (v4 and the Hub's checkpoints: `num_experts`).
  const numExperts = r.posInt('num_experts', r.posInt('num_local_experts', d.numExperts));
  if (r.has('num_local_experts') && r.posInt('num_local_experts') !== numExperts)
    r.fail('num_local_experts', `(${String(r.raw.num_local_experts)}) differs from num_experts (${numExperts})`);
  const moe: MoeConfig = {
    numExperts,
    numExpertsPerTok: r.posInt('num_experts_per_tok', d.numExpertsPerTok),
    moeIntermediateSize: r.posInt('moe_intermediate_size', d.moeIntermediateSize),
    decoderSparseStep: r.posInt('decoder_sparse_step', d.decoderSparseStep),
    mlpOnlyLayers: r.intList('mlp_only_layers', d.mlpOnlyLayers),
    normTopkProb: r.bool('norm_topk_prob', d.normTopkProb),
  };
  if (moe.numExpertsPerTok > moe.numExperts)
    r.fail('num_experts_per_tok', `(${moe.numExpertsPerTok}) exceeds num_experts (${moe.numExperts})`);
  return moe;
}

/** Rejects MoE settings config.json could not express or the engine could not run. */
export function checkMoe(moe: MoeConfig | undefined, numLayers: number): MoeConfig {
  if (!moe) throw new Error('qwen3_moe needs moe settings');
  for (const k of ['numExperts', 'numExpertsPerTok', 'moeIntermediateSize', 'decoderSparseStep'] as const)
    if (!Number.isSafeInteger(moe[k]) || moe[k] <= 0)
      throw new Error(`moe.${k} must be a positive integer, got ${moe[k]}`);
  if (moe.numExpertsPerTok > moe.numExperts)
    throw new Error(`moe.numExpertsPerTok (${moe.numExpertsPerTok}) exceeds moe.numExperts (${moe.numExperts})`);
  const bad = moe.mlpOnlyLayers.find((l) => !Number.isSafeInteger(l) || l < 0 || l >= numLayers);
  if (bad !== undefined) throw new Error(`moe.mlpOnlyLayers: ${bad} is not a layer index in [0, ${numLayers})`);
  return moe;
}

export const qwen3_moe: Family = {
  modelType: 'qwen3_moe',
  hfClass: 'Qwen3MoeForCausalLM',
  defaultMaxPositions: 32768,
  // `model create`'s tiny preset; create.ts scales the experts for `small`.
  defaults: {
    attentionBias: false,
    qkNorm: true,
    moe: {
      numExperts: 8,
      numExpertsPerTok: 2,
      moeIntermediateSize: 96,
      decoderSparseStep: 1,
      mlpOnlyLayers: [],
      normTopkProb: true,
    },
  },
  readFeatures: (r) => {
    rejectSlidingWindow(r);
    return { attentionBias: r.bool('attention_bias', false), qkNorm: true, moe: readMoe(r) };
  },
  hfFields: (a) => {
    if (!a.qkNorm) throw new Error('qkNorm is false but qwen3_moe always has q/k norms');
    const moe = checkMoe(a.moe, a.numLayers);
    return {
      attention_bias: a.attentionBias,
      ...fullAttentionFields(a),
      num_experts: moe.numExperts,
      num_experts_per_tok: moe.numExpertsPerTok,
      moe_intermediate_size: moe.moeIntermediateSize,
      decoder_sparse_step: moe.decoderSparseStep,
      mlp_only_layers: moe.mlpOnlyLayers,
      norm_topk_prob: moe.normTopkProb,
      // transformers' defaults, for its own training; our trainer's option is `loss.router_aux_loss_coef`.
      output_router_logits: false,
      router_aux_loss_coef: 0.001,
    };
  },
  tensors: (a) => {
    const moe = checkMoe(a.moe, a.numLayers);
    const D = a.hiddenSize;
    return decoderTensors(a, { oProjBias: true }, (i, add) => {
      if (!isSparseLayer(moe, i)) {
        add('mlp.gate_proj.weight', [a.intermediateSize, D], 'linear', 'gate');
        add('mlp.up_proj.weight', [a.intermediateSize, D], 'linear', 'up');
        add('mlp.down_proj.weight', [D, a.intermediateSize], 'linear', 'down');
        return;
      }
      const I = moe.moeIntermediateSize;
      add('mlp.gate.weight', [moe.numExperts, D], 'linear', 'router');
      for (let e = 0; e < moe.numExperts; e++) {
        add(`mlp.experts.${e}.gate_proj.weight`, [I, D], 'linear', 'expertGate', e);
        add(`mlp.experts.${e}.up_proj.weight`, [I, D], 'linear', 'expertUp', e);
        add(`mlp.experts.${e}.down_proj.weight`, [D, I], 'linear', 'expertDown', e);
      }
    });
  },
};

/** Llama (LlamaForCausalLM): optional `attention_bias` on q/k/v/o, no q/k norm. */
import type { Family } from './decoder';
import { denseDecoderTensors, noQkNorm } from './decoder';

export const llama: Family = {
  modelType: 'llama',
  hfClass: 'LlamaForCausalLM',
  defaultMaxPositions: 2048,
  defaults: { attentionBias: false, qkNorm: false },
  readFeatures: (r) => ({ attentionBias: r.bool('attention_bias', false), qkNorm: false }),
  hfFields: (a) => {
    noQkNorm(a);
    return { attention_bias: a.attentionBias, mlp_bias: false, pretraining_tp: 1 };
  },
  tensors: (a) => denseDecoderTensors(a, { oProjBias: true }),
};

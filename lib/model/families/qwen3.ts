/** Qwen3 dense (Qwen3ForCausalLM): per-head RMSNorm on q and k, optional `attention_bias` on q/k/v/o. */
import type { Family } from './decoder';
import { denseDecoderTensors, fullAttentionFields, rejectSlidingWindow } from './decoder';

export const qwen3: Family = {
  modelType: 'qwen3',
  hfClass: 'Qwen3ForCausalLM',
  defaultMaxPositions: 32768,
  defaults: { attentionBias: false, qkNorm: true },
  readFeatures: (r) => {
    rejectSlidingWindow(r);
    return { attentionBias: r.bool('attention_bias', false), qkNorm: true };
  },
  hfFields: (a) => {
    if (!a.qkNorm) throw new Error('qkNorm is false but qwen3 always has q/k norms');
    return { attention_bias: a.attentionBias, ...fullAttentionFields(a) };
  },
  tensors: (a) => denseDecoderTensors(a, { oProjBias: true }),
};

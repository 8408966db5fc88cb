/** Qwen2 (Qwen2ForCausalLM): q/k/v biases always (transformers ignores `attention_bias`), none on o_proj. */
import type { Family } from './decoder';
import { denseDecoderTensors, fullAttentionFields, rejectSlidingWindow, noQkNorm } from './decoder';

export const qwen2: Family = {
  modelType: 'qwen2',
  hfClass: 'Qwen2ForCausalLM',
  defaultMaxPositions: 32768,
  defaults: { attentionBias: true, qkNorm: false },
  readFeatures: (r) => {
    rejectSlidingWindow(r);
    return { attentionBias: true, qkNorm: false };
  },
  hfFields: (a) => {
    if (!a.attentionBias) throw new Error('qwen2 always has attention biases (attentionBias must be true)');
    noQkNorm(a);
    return fullAttentionFields(a);
  },
  tensors: (a) => denseDecoderTensors(a, { oProjBias: false }),
};

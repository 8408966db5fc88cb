/**
 * The tensor names and shapes of a Llama/Qwen2/Qwen3 checkpoint in Hugging Face naming. One table
 * serves both directions: `createModel` initialises exactly these tensors, and loading checks a
 * folder against them so a mismatch is reported by name here rather than deep in the engine.
 */
import type { ArchConfig, NamedTensor } from './arch';

export type TensorRole = 'embedding' | 'linear' | 'bias' | 'norm';

export interface TensorSpec {
  name: string;
  shape: number[];
  /** How it is initialised: normal(0, 0.02) for embeddings and linears, zeros for biases, ones for norms. */
  role: TensorRole;
}

/** Every tensor the model has, in a stable order (embedding, layers in order, final norm, head). */
export function tensorSpecs(a: ArchConfig): TensorSpec[] {
  const q = a.numHeads * a.headDim;
  const kv = a.numKvHeads * a.headDim;
  const specs: TensorSpec[] = [{ name: 'model.embed_tokens.weight', shape: [a.vocabSize, a.hiddenSize], role: 'embedding' }];
  for (let i = 0; i < a.numLayers; i++) {
    const p = `model.layers.${i}`;
    specs.push({ name: `${p}.input_layernorm.weight`, shape: [a.hiddenSize], role: 'norm' });
    specs.push({ name: `${p}.self_attn.q_proj.weight`, shape: [q, a.hiddenSize], role: 'linear' });
    specs.push({ name: `${p}.self_attn.k_proj.weight`, shape: [kv, a.hiddenSize], role: 'linear' });
    specs.push({ name: `${p}.self_attn.v_proj.weight`, shape: [kv, a.hiddenSize], role: 'linear' });
    if (a.attentionBias) {
      specs.push({ name: `${p}.self_attn.q_proj.bias`, shape: [q], role: 'bias' });
      specs.push({ name: `${p}.self_attn.k_proj.bias`, shape: [kv], role: 'bias' });
      specs.push({ name: `${p}.self_attn.v_proj.bias`, shape: [kv], role: 'bias' });
    }
    if (a.qkNorm) {
      specs.push({ name: `${p}.self_attn.q_norm.weight`, shape: [a.headDim], role: 'norm' });
      specs.push({ name: `${p}.self_attn.k_norm.weight`, shape: [a.headDim], role: 'norm' });
    }
    specs.push({ name: `${p}.self_attn.o_proj.weight`, shape: [a.hiddenSize, q], role: 'linear' });
    // Llama's and Qwen3's attention_bias also covers o_proj; Qwen2's hard-coded q/k/v biases do not.
    if (a.attentionBias && a.arch !== 'qwen2') specs.push({ name: `${p}.self_attn.o_proj.bias`, shape: [a.hiddenSize], role: 'bias' });
    specs.push({ name: `${p}.post_attention_layernorm.weight`, shape: [a.hiddenSize], role: 'norm' });
    specs.push({ name: `${p}.mlp.gate_proj.weight`, shape: [a.intermediateSize, a.hiddenSize], role: 'linear' });
    specs.push({ name: `${p}.mlp.up_proj.weight`, shape: [a.intermediateSize, a.hiddenSize], role: 'linear' });
    specs.push({ name: `${p}.mlp.down_proj.weight`, shape: [a.hiddenSize, a.intermediateSize], role: 'linear' });
  }
  specs.push({ name: 'model.norm.weight', shape: [a.hiddenSize], role: 'norm' });
  if (!a.tieWordEmbeddings) specs.push({ name: 'lm_head.weight', shape: [a.vocabSize, a.hiddenSize], role: 'linear' });
  return specs;
}

export function parameterCount(a: ArchConfig): number {
  return tensorSpecs(a).reduce((n, s) => n + s.shape.reduce((x, y) => x * y, 1), 0);
}

/**
 * Tensors some checkpoints carry that the model does not use: RoPE frequency buffers (old Llama
 * exports) and a duplicate `lm_head.weight` next to tied embeddings (transformers ignores it too).
 */
function isIgnorable(name: string, a: ArchConfig): boolean {
  return name.endsWith('.rotary_emb.inv_freq') || (a.tieWordEmbeddings && name === 'lm_head.weight');
}

/**
 * Checks that `tensors` are exactly the model's tensors with the right shapes; returns them in
 * `tensorSpecs` order without ignorable extras. `source` (the folder) is named in errors.
 */
export function checkModelTensors(a: ArchConfig, tensors: readonly NamedTensor[], source: string): NamedTensor[] {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const specs = tensorSpecs(a);
  const expected = new Set(specs.map((s) => s.name));
  const unexpected = tensors.filter((t) => !expected.has(t.name) && !isIgnorable(t.name, a)).map((t) => t.name);
  if (unexpected.length > 0) {
    throw new Error(`${source}: unexpected tensor(s) for ${a.arch}: ${unexpected.slice(0, 5).join(', ')}${unexpected.length > 5 ? ', ...' : ''}`);
  }
  return specs.map((s) => {
    const t = byName.get(s.name);
    if (!t) throw new Error(`${source}: missing tensor '${s.name}'`);
    if (t.shape.length !== s.shape.length || t.shape.some((d, i) => d !== s.shape[i])) {
      throw new Error(`${source}: tensor '${s.name}' has shape ${JSON.stringify(t.shape)}, config.json implies ${JSON.stringify(s.shape)}`);
    }
    return t;
  });
}

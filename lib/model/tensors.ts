/**
 * The tensors of a model, from its family's table (`families/`). One table serves every direction:
 * `createModel` initialises exactly these tensors, loading checks a folder against them so a
 * mismatch is reported by name here rather than deep in the engine, and the engine is given it.
 */
import type { ArchConfig, NamedTensor } from './arch';
import { family, type TensorSpec } from './families';

export type { TensorRole, TensorSpec } from './families';

/** Every tensor the model has, in a stable order (embedding, layers in order, final norm, head). */
export function tensorSpecs(a: ArchConfig): TensorSpec[] {
  return family(a.arch).tensors(a);
}

export function parameterCount(a: ArchConfig): number {
  return tensorSpecs(a).reduce((n, s) => n + s.shape.reduce((x, y) => x * y, 1), 0);
}

/**
 * Tensors some checkpoints carry that the model does not use: RoPE frequency buffers (old Llama
 * exports) and a duplicate `lm_head.weight` next to tied embeddings (transformers ignores it too).
 */
export function isIgnorable(name: string, a: ArchConfig): boolean {
  return name.endsWith('.rotary_emb.inv_freq') || (a.tieWordEmbeddings && name === 'lm_head.weight');
}

/**
 * Checks that `tensors` are exactly the model's tensors with the right shapes; returns them in
 * `tensorSpecs` order without ignorable extras. `source` (the folder) is named in errors.
 */
export function checkModelTensors<T extends Pick<NamedTensor, 'name' | 'shape'> = NamedTensor>(
  a: ArchConfig,
  tensors: readonly T[],
  source: string,
): T[] {
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const specs = tensorSpecs(a);
  const expected = new Set(specs.map((s) => s.name));
  const unexpected = tensors.filter((t) => !expected.has(t.name) && !isIgnorable(t.name, a)).map((t) => t.name);
  if (unexpected.length > 0) {
    throw new Error(
      `${source}: unexpected tensor(s) for ${a.arch}: ${unexpected.slice(0, 5).join(', ')}${unexpected.length > 5 ? ', ...' : ''}`,
    );
  }
  return specs.map((s) => {
    const t = byName.get(s.name);
    if (!t) throw new Error(`${source}: missing tensor '${s.name}'`);
    if (t.shape.length !== s.shape.length || t.shape.some((d, i) => d !== s.shape[i])) {
      throw new Error(
        `${source}: tensor '${s.name}' has shape ${JSON.stringify(t.shape)}, config.json implies ${JSON.stringify(s.shape)}`,
      );
    }
    return t;
  });
}

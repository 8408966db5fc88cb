/**
 * The tensors of a model, from its family's table (`families/`). One table serves every direction:
 * `createModel` initialises exactly these tensors, loading checks a folder against them so a
 * mismatch is reported by name here rather than deep in the engine, and the engine is given it.
 */
import type { ArchConfig, NamedTensor } from './arch';
import { family, sparseLayerCount, type TensorSpec } from './families';

export type { TensorRole, TensorSpec } from './families';

/** Every tensor the model has, in a stable order (embedding, layers in order, final norm, head). */
export function tensorSpecs(a: ArchConfig): TensorSpec[] {
  return family(a.arch).tensors(a);
}

const numelOf = (specs: readonly TensorSpec[]) => specs.reduce((n, s) => n + s.shape.reduce((x, y) => x * y, 1), 0);

/**
 * Parameters of `a`, without listing every tensor: a config.json may claim 10^7 blocks or 10^9
 * experts, whose table alone would not fit in memory. Every dense block has the same tensors, and
 * so has every sparse block, whose size grows linearly with its experts (a router row and one MLP
 * each); so the family's table is asked for one block of each kind, at one and two experts.
 */
export function parameterCount(a: ArchConfig): number {
  const moe = a.moe;
  const oneBlock = (sparse: boolean, experts = 1): ArchConfig => ({
    ...a,
    numLayers: 1,
    ...(moe && {
      moe: { ...moe, numExperts: experts, numExpertsPerTok: 1, decoderSparseStep: 1, mlpOnlyLayers: sparse ? [] : [0] },
    }),
  });
  const blockParams = (c: ArchConfig) => numelOf(tensorSpecs(c).filter((s) => s.layer === 0));
  const outside = numelOf(tensorSpecs({ ...a, numLayers: 0, ...(moe && { moe: { ...moe, mlpOnlyLayers: [] } }) }));
  const sparse = sparseLayerCount(moe, a.numLayers);
  let total = outside + (a.numLayers - sparse) * blockParams(oneBlock(false));
  if (sparse > 0) {
    const one = blockParams(oneBlock(true, 1));
    total += sparse * (one + (moe!.numExperts - 1) * (blockParams(oneBlock(true, 2)) - one));
  }
  return total;
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

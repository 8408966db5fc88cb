/**
 * The tensors of a model, from its family's table (`families/`). One table serves every direction:
 * `createModel` initialises exactly these tensors, loading checks a folder against them so a
 * mismatch is reported by name here rather than deep in the engine, and the engine is given it.
 */
import { LAYER_TYPES, type ArchConfig, type LayerType, type WeightTensor } from './arch';
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
  const oneBlock = (sparse: boolean, experts: number, type: LayerType | undefined): ArchConfig => ({
    ...a,
    numLayers: 1,
    ...(moe && {
      moe: { ...moe, numExperts: experts, numExpertsPerTok: 1, decoderSparseStep: 1, mlpOnlyLayers: sparse ? [] : [0] },
    }),
    ...(type && { layerTypes: [type] }),
  });
  const blockParams = (c: ArchConfig) => numelOf(tensorSpecs(c).filter((s) => s.layer === 0));
  const outside = numelOf(
    tensorSpecs({
      ...a,
      numLayers: 0,
      ...(moe && { moe: { ...moe, mlpOnlyLayers: [] } }),
      ...(a.layerTypes && { layerTypes: [] }),
    }),
  );
  const sparse = sparseLayerCount(moe, a.numLayers);
  // A hybrid model's blocks differ by their token mixer: each kind's share of the dense and sparse
  // blocks (the sparse rule does not depend on the mixer in Qwen3.5-MoE, where every block is sparse).
  const kinds: [LayerType | undefined, number][] = a.layerTypes
    ? LAYER_TYPES.map((t) => [t, a.layerTypes!.filter((x) => x === t).length / a.numLayers])
    : [[undefined, 1]];
  let total = outside;
  for (const [type, share] of kinds) {
    if (share === 0) continue;
    if (a.numLayers > sparse) total += share * (a.numLayers - sparse) * blockParams(oneBlock(false, 1, type));
    if (sparse > 0) {
      const one = blockParams(oneBlock(true, 1, type));
      total += share * sparse * (one + (moe!.numExperts - 1) * (blockParams(oneBlock(true, 2, type)) - one));
    }
  }
  return Math.round(total);
}

/**
 * Tensors some checkpoints carry that the model does not use: RoPE frequency buffers (old Llama
 * exports), a duplicate `lm_head.weight` next to tied embeddings (transformers ignores it too),
 * and in a multimodal checkpoint (`Family.nested`) its vision tower and multi-token-prediction
 * head, which a text run does not use (`skippedParts` names them).
 */
export function isIgnorable(name: string, a: ArchConfig): boolean {
  return (
    name.endsWith('.rotary_emb.inv_freq') ||
    (a.tieWordEmbeddings && name === 'lm_head.weight') ||
    (family(a.arch).nested !== undefined && skippedPart(name) !== undefined)
  );
}

/** The parts of a multimodal checkpoint a text run leaves out, by the prefix of their tensors. */
const SKIPPED_PARTS = [
  ['model.visual.', 'the vision tower'],
  ['mtp.', 'the multi-token-prediction head'],
] as const;

function skippedPart(name: string): string | undefined {
  return SKIPPED_PARTS.find(([prefix]) => name.startsWith(prefix))?.[1];
}

/** What of `names` a text run of `a` leaves out, as a sentence (undefined: nothing), for a load's log line. */
export function skippedParts(a: ArchConfig, names: readonly string[]): string | undefined {
  if (family(a.arch).nested === undefined) return undefined;
  const counts = new Map<string, number>();
  for (const n of names) {
    const part = skippedPart(n);
    if (part) counts.set(part, (counts.get(part) ?? 0) + 1);
  }
  if (counts.size === 0) return undefined;
  const parts = [...counts].map(([part, n]) => `${part} (${n} tensors)`).join(' and ');
  return `${a.arch}: a text run does not use ${parts}; skipped`;
}

/**
 * Checks that `tensors` are exactly the model's tensors with the right shapes; returns them in
 * `tensorSpecs` order without ignorable extras. `source` (the folder) is named in errors.
 */
export function checkModelTensors<T extends Pick<WeightTensor, 'name' | 'shape'> = WeightTensor>(
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

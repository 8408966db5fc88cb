/**
 * The Hugging Face binding of the native engine: a model's `ArchConfig` and its family's tensor
 * table (HF names -> engine slots, `tensors.ts`) as the `ModelBinding` the engine builds from.
 * Everything that loads HF weights into the engine goes through here; `native/` knows no HF names.
 */
import * as native from '../../native';
import type { ArchConfig, WeightTensor } from './arch';
import { isIgnorable, tensorSpecs } from './tensors';

/** `config` as the engine sees it: the architecture, the tensor table's engine columns, the ignorable names. */
export function modelBinding(config: ArchConfig): native.ModelBinding {
  return {
    config,
    specs: tensorSpecs(config).map(({ name, shape, slot, layer, expert }) => ({ name, shape, slot, layer, expert })),
    ignorable: (name) => isIgnorable(name, config),
  };
}

/**
 * Builds an engine model from HF-named tensors (bytes are copied once and converted to the compute
 * dtype). Rejects on an unsupported architecture, a missing, extra, mis-shaped or unsupported-dtype
 * tensor, naming it.
 */
export async function loadModel(
  config: ArchConfig,
  tensors: readonly WeightTensor[],
  options: native.ModelOptions = {},
): Promise<native.NativeModel> {
  return native.createModel(modelBinding(config), tensors, options);
}

/** `native.createModelWithoutWeights` of `config` (full sharding fills it shard by shard). */
export async function createModelWithoutWeights(
  config: ArchConfig,
  options: native.ModelOptions = {},
): Promise<native.NativeModel> {
  return native.createModelWithoutWeights(modelBinding(config), options);
}

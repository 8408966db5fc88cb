/** The registry of architecture families: one line per family (see README.md in this folder). */
import { ARCHS, type Arch } from '../../config/names';
import type { Family } from './decoder';
import { llama } from './llama';
import { qwen2 } from './qwen2';
import { qwen3 } from './qwen3';
import { qwen3_moe } from './qwen3_moe';
import { qwen3_5, qwen3_5_text } from './qwen3_5';
import { qwen3_5_moe, qwen3_5_moe_text } from './qwen3_5_moe';

export const FAMILIES = {
  llama,
  qwen2,
  qwen3,
  qwen3_moe,
  qwen3_5_text,
  qwen3_5,
  qwen3_5_moe_text,
  qwen3_5_moe,
} satisfies Record<Arch, Family>;

/** The family of `arch`; an unknown name is an error listing the supported ones. */
export function family(arch: string): Family {
  if (!Object.prototype.hasOwnProperty.call(FAMILIES, arch))
    throw new Error(`unsupported architecture '${arch}' (supported: ${ARCHS.join(', ')})`);
  return FAMILIES[arch as Arch];
}

export { LAYER_SLOTS, PROJECTIONS, isSparseLayer, sparseLayerCount } from './decoder';
export type { Family, FamilyFeatures, LayerSlot, ModelSlot, Projection, TensorRole, TensorSpec } from './decoder';

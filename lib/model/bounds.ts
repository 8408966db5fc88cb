/**
 * What a model's sizes imply in bytes, checked before anything is allocated for them: a
 * config.json claiming 10^7 blocks made the server build a table of 10^8 tensors and die of heap
 * exhaustion. The count comes from `parameterCount`, which never lists every block.
 */
import * as os from 'node:os';
import { formatBytes } from '../files';
import type { ArchConfig } from './arch';
import { ModelConfigError } from './config-reader';
import { HF_FIELDS } from './hf-config';
import { parameterCount } from './tensors';

/** The sizes of every model (positive integers). */
export const DENSE_SIZE_KEYS = [
  'vocabSize',
  'hiddenSize',
  'intermediateSize',
  'numLayers',
  'numHeads',
  'numKvHeads',
  'headDim',
] as const;
/** The sizes of an ArchConfig (MoE ones under `moe`): what can make a model large. */
const SIZE_KEYS = [...DENSE_SIZE_KEYS, 'numExperts', 'moeIntermediateSize'] as const;
export type SizeKey = (typeof SIZE_KEYS)[number];

/** 16-bit floats are the smallest weights the engine loads: a folder holds at least 2 bytes a parameter. */
export const MIN_BYTES_PER_PARAMETER = 2;

function sizeOf(a: ArchConfig, key: SizeKey): number | undefined {
  return key === 'numExperts' || key === 'moeIntermediateSize' ? a.moe?.[key] : a[key];
}

function withSize(a: ArchConfig, key: SizeKey, value: number): ArchConfig {
  if (key === 'numExperts' || key === 'moeIntermediateSize') return { ...a, moe: { ...a.moe!, [key]: value } };
  return { ...a, [key]: value };
}

/**
 * The size that makes `a` large, to name in an error: the one whose reduction to 1 would shrink the
 * parameter count the most (num_hidden_layers for 10^7 blocks, vocab_size for a 10^12 vocabulary).
 */
export function largestSize(a: ArchConfig): { key: SizeKey; value: number } {
  const total = parameterCount(a);
  let best: { key: SizeKey; value: number; shrink: number } | undefined;
  for (const key of SIZE_KEYS) {
    const value = sizeOf(a, key);
    if (value === undefined) continue;
    const shrink = total / Math.max(1, parameterCount(withSize(a, key, 1)));
    if (!best || shrink > best.shrink) best = { key, value, shrink };
  }
  return best!;
}

/**
 * Refuses a config.json (`file`) whose sizes need more bytes than the folder's weight files hold
 * (`onDisk`), naming the field that makes it large and the bytes implied: such a config does not
 * describe these weights, and allocating by it could exhaust memory. Costs no allocation.
 */
export function checkWeightsFit(a: ArchConfig, file: string, onDisk: number): void {
  const parameters = parameterCount(a);
  const least = parameters * MIN_BYTES_PER_PARAMETER;
  if (least <= onDisk) return;
  const { key, value } = largestSize(a);
  throw new ModelConfigError(
    file,
    HF_FIELDS[key],
    `(${value}) makes ${parameters < 1e15 ? parameters.toLocaleString('en-US') : parameters.toExponential(2)} parameters: at least ${formatBytes(least)} of weights, but the folder's weight files hold ${formatBytes(onDisk)}; config.json does not describe these weights`,
  );
}

/** A model too large for this machine's memory: `key` is the size that makes it so. */
export class ModelTooLarge extends Error {
  override readonly name = 'ModelTooLarge';
  constructor(
    readonly key: SizeKey,
    readonly value: number,
    why: string,
  ) {
    super(why);
  }
}

/**
 * Refuses to allocate the weights of `a` at `bytesPerParameter` when they exceed this machine's
 * memory (`model create` holds every tensor at once), naming the size that makes them large.
 */
export function checkFitsInMemory(a: ArchConfig, bytesPerParameter: number, memory = os.totalmem()): void {
  const bytes = parameterCount(a) * bytesPerParameter;
  if (bytes <= memory) return;
  const { key, value } = largestSize(a);
  throw new ModelTooLarge(
    key,
    value,
    `${value} makes ${formatBytes(bytes)} of weights to hold while they are made, more than this machine's ${formatBytes(memory)} of memory`,
  );
}

/**
 * The memory plan of training a model (`prime-rl model plan`): the bytes one trainer rank holds for
 * weights, gradients, AdamW state, parameters and gradients in flight, and activations, at a world
 * size and sharding mode, and the longest packed row that fits one device.
 *
 * Weights, gradients and AdamW state follow the engine exactly (test/native.dist.test.ts checks
 * them against what ranks account, `Trainer.memory`): fp32 master weights, gradients and moments;
 * the parameters in units (the embedding, each decoder layer, the final norm, an untied head;
 * native/src/fsdp.h), rank r of N holding ceil(n / N) elements of a unit of n under full sharding;
 * ZeRO-1 assigning whole parameters greedily by size. The rest are estimates of what a GPU step
 * holds (CUDA, bf16 flash attention; the CPU's attention also keeps each sample's scores):
 *
 *   - in flight: full sharding gathers two units at once (one computing, the next prefetched) in
 *     the compute dtype, and in the backward also holds a unit's gradients in the compute dtype and
 *     up to two fp32 reduce-scatter buffers; ZeRO-1 under mixed precision keeps autocast's bf16
 *     copies of the weights for the step's forward and backward.
 *   - activations of one packed row (rows train one at a time): what a layer's backward needs
 *     (its input and norms, q/k/v before and after their norms and RoPE, attention's output and
 *     log-sum-exp, the MLP's gate, up and product), for every layer, or with activation
 *     checkpointing each layer's input plus one layer's worth (the layer running again) and its
 *     gradients; plus the LM head's chunk of fp32 logits and their gradient (lm_head.h).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type * as native from '../../native';
import { ConfigError } from '../failures';
import { SHARDINGS, type ModelPlanConfig } from '../config/schemas';
import type { ArchConfig } from '../model/arch';
import { isSparseLayer } from '../model/families/decoder';
import { readHfConfigShape } from '../model/hf';
import { tensorSpecs } from '../model/tensors';
import { projectRoot } from '../paths';

export interface PlanInput {
  config: ArchConfig;
  worldSize: number;
  sharding: native.Sharding;
  /** Tokens of one packed row. */
  seqLen: number;
  /** Activation checkpointing of every layer. */
  ac: boolean;
  /** bfloat16: mixed precision (fp32 master weights); float32: everything fp32. */
  dtype: 'bfloat16' | 'float32';
  /** LoRA rank, adapters on every projection; 0 = full fine-tuning. */
  loraRank: number;
}

/** Bytes per rank (the largest rank's where they differ). */
export interface MemoryPlan {
  parameters: number;
  /** The units' element counts, forward order. */
  units: { name: string; numel: number }[];
  weights: number;
  gradients: number;
  optimizer: number;
  inFlight: number;
  activations: number;
  lmHead: number;
  total: number;
  /** Activation bytes one more token of the row costs. */
  perToken: number;
}

const GiB = 2 ** 30;
const FP32 = 4;

/** The model's units as the engine forms them, with their parameters' sizes. */
export function planUnits(a: ArchConfig): { name: string; params: number[] }[] {
  const units = new Map<string, number[]>();
  const unitOf = (slot: string, layer: number) =>
    layer >= 0 ? `layers.${layer}` : slot === 'embed' ? 'embed' : slot === 'norm' ? 'norm' : 'head';
  // Forward order: the embedding, the layers, the final norm, the head.
  for (const name of ['embed', ...Array.from({ length: a.numLayers }, (_, l) => `layers.${l}`), 'norm', 'head'])
    units.set(name, []);
  for (const s of tensorSpecs(a)) units.get(unitOf(s.slot, s.layer))!.push(s.shape.reduce((x, y) => x * y, 1));
  return [...units].filter(([, params]) => params.length > 0).map(([name, params]) => ({ name, params }));
}

/** Per token, the bytes a layer's backward needs of its forward (see the module comment). */
function layerActivationsPerToken(a: ArchConfig, layer: number, c: number, loraRank: number): number {
  const D = a.hiddenSize,
    q = a.numHeads * a.headDim,
    kv = a.numKvHeads * a.headDim;
  const attention = c * (4 * D + 3 * q + 3 * kv + kv + q) + FP32 * (2 + a.numHeads);
  let mlp = c * 4 * a.intermediateSize;
  if (a.moe && isSparseLayer(a.moe, layer)) {
    const K = a.moe.numExpertsPerTok;
    // Each token's K expert rows (gathered input and weighted output) and their SwiGLU, the router's fp32 logits.
    mlp = c * K * (2 * D + 4 * a.moe.moeIntermediateSize) + FP32 * a.moe.numExperts;
  }
  // LoRA: each projection's A x (rank values) beside the input it shares.
  return attention + mlp + c * 7 * loraRank;
}

export function memoryPlan(p: PlanInput): MemoryPlan {
  const { config: a, worldSize: N } = p;
  const c = p.dtype === 'bfloat16' ? 2 : FP32;
  const specs = tensorSpecs(a);
  const units = planUnits(a).map((u) => ({ name: u.name, numel: u.params.reduce((x, y) => x + y, 0) }));
  const parameters = units.reduce((n, u) => n + u.numel, 0);
  const full = p.sharding === 'full';
  const shard = (numel: number) => Math.ceil(numel / N);
  const perRank = units.reduce((n, u) => n + shard(u.numel), 0);
  // LoRA adapters: A [r, in] and B [out, r] on every projection, replicated, ZeRO-1 over ranks.
  const adapters = specs
    .filter((s) => /^(q|k|v|o|gate|up|down|expertGate|expertUp|expertDown)$/.test(s.slot))
    .map((s) => p.loraRank * (s.shape[0] + s.shape[1]));
  const lora = p.loraRank > 0;
  const trainable = lora ? adapters : specs.map((s) => s.shape.reduce((x, y) => x * y, 1));
  // ZeRO-1's owners: each parameter to the rank owning the fewest values yet (the largest rank's share).
  const owned = new Array<number>(N).fill(0);
  for (const n of trainable) owned[owned.indexOf(Math.min(...owned))] += n;
  const replicatedOptimizer = 2 * FP32 * Math.max(...owned);
  const adapterCount = adapters.reduce((x, y) => x + y, 0);

  const base = FP32 * (full ? perRank : parameters);
  const weights = base + (lora ? FP32 * adapterCount : 0);
  const gradients = lora ? FP32 * adapterCount : base;
  const optimizer = full && !lora ? 2 * FP32 * perRank : replicatedOptimizer;
  const sizes = units.map((u) => u.numel).sort((x, y) => y - x);
  const [largest, second = 0] = sizes;
  const inFlight = full
    ? c * (largest + second) + (lora ? 0 : c * largest + 2 * FP32 * largest)
    : c === FP32
      ? 0
      : c * parameters;

  const L = p.seqLen;
  const layers = Array.from({ length: a.numLayers }, (_, l) => layerActivationsPerToken(a, l, c, p.loraRank));
  const perToken = p.ac ? a.numLayers * c * a.hiddenSize + 2 * Math.max(...layers) : layers.reduce((x, y) => x + y, 0);
  const activations = perToken * L;
  // The LM head's chunk of fp32 logits and their gradient (GPU chunks: 2^28 logits, 16..8192 tokens).
  const chunkTokens = Math.min(8192, Math.max(16, Math.floor(2 ** 28 / a.vocabSize)));
  const lmHead = 2 * FP32 * Math.min(L, chunkTokens) * a.vocabSize;
  const total = weights + gradients + optimizer + inFlight + activations + lmHead;
  return {
    parameters,
    units,
    weights,
    gradients,
    optimizer,
    inFlight,
    activations,
    lmHead,
    total,
    perToken,
  };
}

/** The longest packed row whose plan fits `deviceBytes` (0 when even the state alone does not). */
export function longestRow(p: Omit<PlanInput, 'seqLen'>, deviceBytes: number): number {
  // Everything but the activations is affine in the row length up to the LM head's chunk: search.
  let lo = 0,
    hi = 1 << 24;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (memoryPlan({ ...p, seqLen: mid }).total <= deviceBytes) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** The plan as a table, one column per sharding mode given. */
export function formatPlan(
  a: ArchConfig,
  inputs: PlanInput[],
  deviceGiB: number,
  describe: (p: PlanInput) => string,
): string {
  const plans = inputs.map((p) => memoryPlan(p));
  const first = inputs[0];
  const gib = (b: number) => (b / GiB).toFixed(2).padStart(12);
  const row = (label: string, f: (m: MemoryPlan) => number) =>
    `${label.padEnd(48)}${plans.map((m) => gib(f(m))).join('')}`;
  const mode = (p: PlanInput) => `${p.sharding === 'full' ? 'full' : 'optimizer'}`.padStart(12);
  const c = first.dtype === 'bfloat16' ? 'bf16' : 'fp32';
  return [
    `${a.arch}: ${(plans[0].parameters / 1e9).toFixed(2)}B parameters (${a.numLayers} layers, hidden ${a.hiddenSize}, vocab ${a.vocabSize}${a.tieWordEmbeddings ? ', tied' : ''})`,
    describe(first),
    '',
    `${'GiB per rank'.padEnd(48)}${inputs.map(mode).join('')}`,
    row(`weights (fp32 master${first.loraRank > 0 ? ', + adapters' : ''})`, (m) => m.weights),
    row('gradients (fp32)', (m) => m.gradients),
    row('AdamW state (fp32 moments)', (m) => m.optimizer),
    row(`in flight (gathered units, ${c} weight copies)`, (m) => m.inFlight),
    row(`activations (row of ${first.seqLen}${first.ac ? ', checkpointed' : ''})`, (m) => m.activations),
    row('LM head (a chunk of fp32 logits and its grad)', (m) => m.lmHead),
    row('total', (m) => m.total),
    `${`longest packed row in ${deviceGiB} GiB`.padEnd(48)}${inputs
      .map((p) => String(longestRow(p, deviceGiB * GiB)).padStart(12))
      .join('')}`,
  ].join('\n');
}

/** Model presets (config.json shapes of public models): configs/models/<name>/. */
const PRESETS_DIR = path.join(projectRoot, 'configs', 'models');

/** `prime-rl model plan`: the plan of `c.model` (a folder or a preset) as a table. */
export function printModelPlan(c: ModelPlanConfig): string {
  const presets = fs.readdirSync(PRESETS_DIR);
  const dir = presets.includes(c.model) ? path.join(PRESETS_DIR, c.model) : c.model;
  if (!fs.existsSync(path.join(dir, 'config.json')))
    throw new ConfigError(
      `model: '${c.model}' is neither a model folder with a config.json nor a preset (${presets.join(', ')})`,
    );
  const { config } = readHfConfigShape(dir);
  const inputs = (c.sharding ? [c.sharding] : SHARDINGS).map((sharding) => ({
    config,
    worldSize: c.world_size,
    sharding,
    seqLen: c.seq_len,
    ac: c.ac,
    dtype: c.dtype,
    loraRank: c.lora_rank,
  }));
  const describe = (p: PlanInput) =>
    `world size ${p.worldSize}, ${p.dtype === 'bfloat16' ? 'bf16 mixed precision' : 'fp32'}, ` +
    `${p.loraRank > 0 ? `LoRA rank ${p.loraRank}` : 'full fine-tuning'}, rows of ${p.seqLen} tokens` +
    `${p.ac ? ', activation checkpointing' : ''}`;
  return formatPlan(config, inputs, c.device_memory_gib, describe);
}

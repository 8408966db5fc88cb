/**
 * The GPU checks of issue #16, shared by the script a bare GPU machine runs
 * (bench/gpu-checks.ts, through scripts/gpu/run.sh: no jest there) and the jest `gpu` tier
 * (test/gpu/cuda.test.ts). Each check compares the engine on `device` with an independent
 * reference and returns pass / fail / skip with the figures it measured; none throws for a
 * mismatch. They also run on `cpu` (the bf16 ones then skip): that is how the checks themselves are
 * tested on a machine without a GPU.
 */
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as native from '../../native';
import { loadModel } from '../../lib/model/engine';
import type {
  ComputeDType,
  GenerationRequest,
  Generator,
  KernelCheckOptions,
  NativeModel,
  TrainRow,
  TrainStepStats,
  WeightTensor,
} from '../../native';
import type { ArchConfig } from '../../lib/model/arch';
import { loadHfModel, writeHfModel } from '../../lib/model/hf';
import { toHfConfig } from '../../lib/model/hf-config';
import { decode, packRow, randomTokens, randomWeights, tinyConfig } from '../../lib/model/testing';
import { Rng } from '../../lib/model/rng';
import { freePort } from '../../lib/net';
import { projectRoot, temporalCliPath } from '../../lib/paths';
import { verdict, type Check, type CheckContext, type CheckResult } from './check';
import { QWEN35_CHECKS } from './qwen35-checks';
import { joinRanks, maxDiff as weightsApart, readAll, single, stepAll, type RankOptions } from './ranks';

const isCuda = (device: string) => device.startsWith('cuda');
const NO_CUDA: CheckResult = { status: 'skip', detail: 'no CUDA (bf16 is meant for CUDA)' };
const fmt = (x: number) => x.toExponential(2);

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) return Infinity;
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}
const meanAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) =>
  Array.from(a, (v, i) => Math.abs(v - b[i])).reduce((s, v) => s + v, 0) / Math.max(1, a.length);

/**
 * The checks' model: Qwen3 layout (q/k norms, tied embeddings) with head_dim 128 as Qwen3-0.6B,
 * small enough to run in seconds on a CPU, weights large enough that distributions are far from
 * uniform (so logprob differences are not hidden by a flat softmax).
 */
export const CHECK_CONFIG: ArchConfig = tinyConfig('qwen3', {
  vocabSize: 512,
  hiddenSize: 256,
  intermediateSize: 512,
  numLayers: 3,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 128,
  ropeTheta: 1e6,
  maxPositionEmbeddings: 1024,
});
const WEIGHTS_SEED = 7;

/** The check model as an HF folder (transformers reads it too), written once per work dir. */
function checkModelDir(ctx: CheckContext): string {
  const dir = path.join(ctx.workDir, 'model');
  if (!fs.existsSync(path.join(dir, 'config.json'))) {
    writeHfModel(dir, {
      config: toHfConfig(CHECK_CONFIG, { bos: 0, eos: 1, pad: 0 }, 'float32'),
      tensors: randomWeights(CHECK_CONFIG, WEIGHTS_SEED).map((t) => ({ ...t, dtype: 'F32' as const })),
    });
  }
  return dir;
}

async function loadCheckModel(ctx: CheckContext, device: string, dtype: ComputeDType): Promise<NativeModel> {
  const hf = loadHfModel(checkModelDir(ctx));
  return loadModel(hf.config, hf.tensors, { device, dtype });
}

/** Runs scripts/gpu/hf_logprobs.py; null (with the reason) when python3 lacks torch or transformers. */
function hfLogprobs(
  ctx: CheckContext,
  dtype: ComputeDType,
  sequences: number[][],
): { logprobs: number[][] } | { missing: string } {
  const probe = spawnSync(ctx.python, ['-c', 'import torch, transformers'], { encoding: 'utf8' });
  if (probe.status !== 0) return { missing: `${ctx.python} cannot import torch and transformers` };
  const res = spawnSync(
    ctx.python,
    [path.join(projectRoot, 'scripts', 'gpu', 'hf_logprobs.py'), checkModelDir(ctx), ctx.device, dtype],
    { input: JSON.stringify({ sequences }), encoding: 'utf8', maxBuffer: 1 << 28 },
  );
  if (res.status !== 0) throw new Error(`hf_logprobs.py failed (${res.status}):\n${res.stderr}`);
  return JSON.parse(res.stdout) as { logprobs: number[][] };
}

/** Two sequences of different lengths, scored by us as one packed row (as the trainer sees them). */
function referenceSequences(): number[][] {
  const rng = new Rng(5);
  return [randomTokens(rng, 97, CHECK_CONFIG.vocabSize), randomTokens(rng, 160, CHECK_CONFIG.vocabSize)];
}

async function ourLogprobs(ctx: CheckContext, dtype: ComputeDType, sequences: number[][]): Promise<number[][]> {
  const model = await loadCheckModel(ctx, ctx.device, dtype);
  const [scores] = await model.score([packRow(sequences)]);
  const out: number[][] = [];
  let offset = 0;
  for (const s of sequences) {
    out.push(Array.from(scores.logprobs.subarray(offset, offset + s.length)));
    offset += s.length;
  }
  return out;
}

const logprobsFp32: Check = {
  name: 'logprobs vs transformers, fp32',
  async run(ctx) {
    const seqs = referenceSequences();
    const hf = hfLogprobs(ctx, 'float32', seqs);
    if ('missing' in hf) return { status: 'skip', detail: hf.missing };
    const ours = await ourLogprobs(ctx, 'float32', seqs);
    const worst = Math.max(...seqs.map((_, i) => maxAbsDiff(ours[i], hf.logprobs[i])));
    return verdict(worst <= 1e-4, `max |ours - transformers| ${fmt(worst)} (bound 1e-4)`);
  },
};

/**
 * bf16 rounds every matmul input to 8 significant bits, so no bf16 path is close to the fp32
 * answer token by token; what must hold is that `ours` is no worse than a bf16 `reference` run:
 * both measured against `exact` (fp32), ours within 2x the reference's error (mean and max over
 * tokens), plus a floor of 1e-3 for the case where both are tiny.
 */
function noWorseThan(
  ours: number[],
  reference: number[],
  exact: number[],
  names: [string, string],
): { ok: boolean; detail: string } {
  const [oMean, rMean] = [meanAbsDiff(ours, exact), meanAbsDiff(reference, exact)];
  const [oMax, rMax] = [maxAbsDiff(ours, exact), maxAbsDiff(reference, exact)];
  return {
    ok: oMean <= 2 * rMean + 1e-3 && oMax <= 2 * rMax + 1e-3,
    detail: `vs fp32: ${names[0]} mean ${fmt(oMean)} max ${fmt(oMax)}; ${names[1]} mean ${fmt(rMean)} max ${fmt(rMax)} (bound 2x + 1e-3)`,
  };
}

/** Ours in bf16 no worse than transformers' own bf16 run on the same card (noWorseThan). */
const logprobsBf16: Check = {
  name: 'logprobs vs transformers, bf16',
  async run(ctx) {
    if (!isCuda(ctx.device)) return NO_CUDA;
    const seqs = referenceSequences();
    const ref = hfLogprobs(ctx, 'float32', seqs);
    if ('missing' in ref) return { status: 'skip', detail: ref.missing };
    const hf = hfLogprobs(ctx, 'bfloat16', seqs) as { logprobs: number[][] };
    const ours = await ourLogprobs(ctx, 'bfloat16', seqs);
    const { ok, detail } = noWorseThan(ours.flat(), hf.logprobs.flat(), ref.logprobs.flat(), [
      'ours',
      'transformers bf16',
    ]);
    return verdict(ok, detail);
  },
};

/**
 * KV-cache decode (batched, different prompt lengths) against a full forward of the same tokens:
 * in fp32 within 1e-4; in bf16 the cached path (keys from the cache, fp32 scores) and the forward
 * (flash attention over the row) round differently, neither is the other's reference, so decoding
 * must be no worse than the bf16 forward against the fp32 forward of the same weights.
 */
function kvDecode(dtype: ComputeDType): Check {
  return {
    name: `KV-cache decode equals a full forward, ${dtype === 'float32' ? 'fp32' : 'bf16'}`,
    async run(ctx) {
      if (dtype !== 'float32' && !isCuda(ctx.device)) return NO_CUDA;
      const model = await loadCheckModel(ctx, ctx.device, dtype);
      const rng = new Rng(3);
      const prompts = [1, 7, 30, 64].map((n) => randomTokens(rng, n, CHECK_CONFIG.vocabSize));
      const gen = model.createGenerator({ maxSequences: 8, maxSequenceLength: 128 });
      const added = await gen.add(prompts.map((p, i) => ({ promptIds: p, temperature: 1, maxTokens: 24, seed: i })));
      const out = new Map(added.map((a) => [a.seqId, { tokens: [] as number[], logprobs: [] as number[] }]));
      while (gen.stats().activeSequences > 0) {
        for (const t of await gen.step()) {
          out.get(t.seqId)!.tokens.push(t.token);
          out.get(t.seqId)!.logprobs.push(t.logprob);
        }
      }
      const res = added.map((a) => out.get(a.seqId)!);
      const rows = prompts.map((p, i) => packRow([[...p, ...res[i].tokens]]));
      const generated = (scores: { logprobs: Float32Array }[]) =>
        scores.flatMap((s, i) => Array.from(s.logprobs.slice(prompts[i].length)));
      const decoded = res.flatMap((r) => r.logprobs);
      const forward = generated(await model.score(rows));
      const { cudaGraphs, eagerReason } = gen.stats();
      const how = cudaGraphs > 0 ? `${cudaGraphs} CUDA graphs` : `eager: ${eagerReason}`;
      if (dtype === 'float32') {
        const worst = maxAbsDiff(decoded, forward);
        return verdict(worst <= 1e-4, `max |decode - forward| ${fmt(worst)} over 4x24 tokens (bound 1e-4; ${how})`);
      }
      const exact = generated(await (await loadCheckModel(ctx, ctx.device, 'float32')).score(rows));
      const { ok, detail } = noWorseThan(decoded, forward, exact, ['decode', 'bf16 forward']);
      return verdict(ok, `${detail}; ${how}; decode vs bf16 forward max ${fmt(maxAbsDiff(decoded, forward))}`);
    },
  };
}

/**
 * Decode steps replayed from CUDA graphs against the same steps run eagerly, in fp32: same tokens
 * (seeded sampling and greedy) and logprobs, while the batch grows (a request joins mid-way),
 * shrinks (requests finish at different lengths) and the context crosses key buckets (64, 128,
 * 256), so several graphs are captured and replayed with padding rows. (In bf16 a padded batch's
 * matmuls round differently enough to flip a sampled token now and then; the bf16 KV-cache check
 * above runs through graphs against a full forward.)
 */
const graphDecode: Check = {
  name: 'CUDA-graph decode equals eager decode, fp32',
  async run(ctx) {
    if (!isCuda(ctx.device)) return { status: 'skip', detail: 'no CUDA (graphs are captured on CUDA only)' };
    const model = await loadCheckModel(ctx, ctx.device, 'float32');
    const rng = new Rng(5);
    const prompts = [3, 50, 120, 9, 70].map((n) => randomTokens(rng, n, CHECK_CONFIG.vocabSize));
    const maxTokens = [100, 20, 130, 60, 90];
    const decodeAll = async (cudaGraphs: boolean) => {
      const gen = model.createGenerator({ maxSequences: 8, maxSequenceLength: 260, cudaGraphs });
      const req = (i: number) => ({
        promptIds: prompts[i],
        temperature: i === 1 ? 0 : 1,
        maxTokens: maxTokens[i],
        seed: i,
      });
      const ids = (await gen.add([0, 1, 2, 3].map(req))).map((a) => a.seqId);
      const out = new Map<number, { tokens: number[]; logprobs: number[] }>();
      for (let step = 0; gen.stats().activeSequences > 0; step++) {
        if (step === 10) ids.push((await gen.add([req(4)]))[0].seqId);
        for (const t of await gen.step()) {
          if (!out.has(t.seqId)) out.set(t.seqId, { tokens: [], logprobs: [] });
          out.get(t.seqId)!.tokens.push(t.token);
          out.get(t.seqId)!.logprobs.push(t.logprob);
        }
      }
      return { res: ids.map((id) => out.get(id)!), stats: gen.stats() };
    };
    const graphs = await decodeAll(true);
    const eager = await decodeAll(false);
    if (graphs.stats.eagerReason !== '' || graphs.stats.cudaGraphs === 0)
      return verdict(false, `no graphs were used: ${graphs.stats.eagerReason || '0 captured'}`);
    const sameTokens = graphs.res.every((r, i) => r.tokens.join() === eager.res[i].tokens.join());
    const worst = Math.max(...graphs.res.map((r, i) => maxAbsDiff(r.logprobs, eager.res[i].logprobs)));
    return verdict(
      sameTokens && worst <= 1e-4,
      `${graphs.stats.cudaGraphs} graphs captured; same tokens: ${sameTokens}; max |graph - eager| logprob ${fmt(worst)} (bound 1e-4)`,
    );
  },
};

/** Runs the requests on a generator, feeding them in order as it has room; tokens and logprobs per request. */
async function serveAll(
  gen: Generator,
  requests: GenerationRequest[],
  maxSteps = 1,
): Promise<{ tokens: number[]; logprobs: number[] }[]> {
  const out = requests.map(() => ({ tokens: [] as number[], logprobs: [] as number[] }));
  const index = new Map<number, number>();
  let next = 0;
  while (next < requests.length || gen.stats().activeSequences > 0) {
    for (const a of await gen.add(requests.slice(next))) index.set(a.seqId, next++);
    for (const t of await gen.step(maxSteps)) {
      out[index.get(t.seqId)!].tokens.push(t.token);
      out[index.get(t.seqId)!].logprobs.push(t.logprob);
    }
  }
  return out;
}

/** Same tokens, and the largest logprob difference. */
function compareRuns(a: { tokens: number[]; logprobs: number[] }[], b: typeof a): { same: boolean; worst: number } {
  return {
    same: a.every((r, i) => r.tokens.join() === b[i].tokens.join()),
    worst: Math.max(...a.map((r, i) => maxAbsDiff(r.logprobs, b[i].logprobs))),
  };
}

/**
 * The paged cache under pressure on the device, fp32: a group of rollouts sharing a prompt (prefix
 * sharing, copy on write), prompts prefilled in small chunks (attention of a chunk over cached
 * keys), and a pool of 24 blocks that preempts, against the same requests on a roomy generator
 * without sharing: the same tokens, logprobs within 1e-4, every block free at the end.
 */
const pagedDecode: Check = {
  name: 'paged decode: shared prefixes, chunked prefill and preemption equal a roomy unshared run, fp32',
  async run(ctx) {
    const model = await loadCheckModel(ctx, ctx.device, 'float32');
    const rng = new Rng(9);
    const shared = randomTokens(rng, 70, CHECK_CONFIG.vocabSize);
    const requests: GenerationRequest[] = [
      ...[0, 1, 2, 3].map((i) => ({ promptIds: shared, maxTokens: 120, temperature: 1, seed: i })),
      ...[5, 40, 90].map((n, i) => ({
        promptIds: randomTokens(rng, n, CHECK_CONFIG.vocabSize),
        maxTokens: 100,
        seed: 9 + i,
      })),
    ];
    const roomy = await serveAll(
      model.createGenerator({ maxSequences: 8, maxSequenceLength: 256, prefixSharing: 'off' }),
      requests,
    );
    const gen = model.createGenerator({
      maxSequences: 8,
      maxSequenceLength: 256,
      kvCacheTokens: 24 * 16,
      maxBatchedTokens: 32,
    });
    const tight = await serveAll(gen, requests);
    const s = gen.stats();
    const { same, worst } = compareRuns(tight, roomy);
    return verdict(
      same && worst <= 1e-4 && s.preemptions > 0 && s.prefixHitTokens > 0 && s.blocksInUse === 0,
      `same tokens: ${same}; max |tight - roomy| logprob ${fmt(worst)} (bound 1e-4); ${s.preemptions} preemptions, ${s.prefixHitTokens} positions shared, ${s.blocksInUse} blocks left in use; ${s.cudaGraphs} CUDA graphs`,
    );
  },
};

/**
 * Several decode steps per engine call (tokens fed back on the device, one read per call; CUDA
 * graphs replayed per step) against one step per call, fp32: the same tokens and logprobs.
 */
const multiStepDecode: Check = {
  name: 'several decode steps per call equal one per call, fp32',
  async run(ctx) {
    const model = await loadCheckModel(ctx, ctx.device, 'float32');
    const rng = new Rng(10);
    const requests: GenerationRequest[] = [3, 20, 60, 9].map((n, i) => ({
      promptIds: randomTokens(rng, n, CHECK_CONFIG.vocabSize),
      maxTokens: 50 + 10 * i,
      temperature: i === 0 ? 0 : 1,
      topP: i === 2 ? 0.9 : 1,
      seed: i,
    }));
    const make = () => model.createGenerator({ maxSequences: 4, maxSequenceLength: 256 });
    const one = await serveAll(make(), requests, 1);
    const gen = make();
    const eight = await serveAll(gen, requests, 8);
    const { same, worst } = compareRuns(eight, one);
    const t = gen.stats().times;
    return verdict(
      same && worst <= 1e-4,
      `same tokens: ${same}; max logprob difference ${fmt(worst)} (bound 1e-4); ${t.steps} steps in ${t.calls} calls`,
    );
  },
};

/** The check model's layout with 10 query heads per kv head: more than 2, and more than the 8 the paged kernel takes a pass. */
const WIDE_GQA_CONFIG: ArchConfig = { ...CHECK_CONFIG, numHeads: 20, numKvHeads: 2 };

/** A CUDA device other than 0, where the addon sees more than one (null: it sees one). */
function nonZeroDevice(): string | null {
  const n = native.info().cudaDevices;
  return n > 1 ? `cuda:${n - 1}` : null;
}

type PagedCase = 'check model' | 'wide group' | 'non-zero device';

/**
 * The engine's CUDA paged decode kernel (flash-decoding over the blocks in place) against
 * libtorch's batched matmuls over gathered blocks: in fp32 the same tokens and logprobs within
 * 1e-4, through CUDA graphs, with contexts of one partition (one position to 256: the kernel writes
 * the output itself) and of several (up to 700 positions: 3 of 256, combined); in bf16 no worse
 * than the bf16 forward against the fp32 forward. Cases: the check model (2 query heads per kv
 * head), 10 query heads per kv head, and the check model on a non-zero device after work on device
 * 0 (the launch and its stream must follow the model's device). A kernel the generator refuses
 * fails the check: on a card it must run.
 */
function pagedKernel(dtype: ComputeDType, which: PagedCase): Check {
  const precision = dtype === 'float32' ? 'fp32' : 'bf16';
  const label =
    which === 'check model' ? '' : which === 'wide group' ? ', 10 query heads per kv head' : ', non-zero device';
  return {
    name: `paged decode kernel equals libtorch's attention${label}, ${precision}`,
    async run(ctx) {
      if (!isCuda(ctx.device)) return { status: 'skip', detail: 'no CUDA (a CUDA kernel)' };
      let device = ctx.device;
      if (which === 'non-zero device') {
        const other = nonZeroDevice();
        if (!other) return { status: 'skip', detail: 'one CUDA device: no non-zero device to run on' };
        device = other;
        // Work on device 0 first, as a process serving on several cards does.
        await (await loadCheckModel(ctx, 'cuda:0', 'float32')).score(trainRows(1));
      }
      const load = async (dt: ComputeDType) =>
        which === 'wide group'
          ? loadModel(WIDE_GQA_CONFIG, randomWeights(WIDE_GQA_CONFIG, WEIGHTS_SEED), { device, dtype: dt })
          : loadCheckModel(ctx, device, dt);
      const model = await load(dtype);
      const rng = new Rng(11);
      const prompts = [1, 90, 300, 560].map((n) => randomTokens(rng, n, CHECK_CONFIG.vocabSize));
      const requests: GenerationRequest[] = prompts.map((p, i) => ({
        promptIds: p,
        maxTokens: 140,
        temperature: 1,
        seed: i,
      }));
      const make = (pagedAttentionKernel: boolean) =>
        model.createGenerator({ maxSequences: 4, maxSequenceLength: 720, pagedAttentionKernel });
      let kernel: Generator;
      try {
        kernel = make(true);
      } catch (e) {
        return verdict(false, `the kernel was refused on ${device}: ${(e as Error).message}`);
      }
      const ours = await serveAll(kernel, requests);
      const torch = await serveAll(make(false), requests);
      const graphs = kernel.stats().cudaGraphs;
      if (dtype === 'float32') {
        const { same, worst } = compareRuns(ours, torch);
        return verdict(
          same && worst <= 1e-4,
          `${device}: same tokens: ${same}; max |kernel - libtorch| logprob ${fmt(worst)} (bound 1e-4); ${graphs} CUDA graphs`,
        );
      }
      const rows = prompts.map((p, i) => packRow([[...p, ...ours[i].tokens]]));
      const generated = (scores: { logprobs: Float32Array }[]) =>
        scores.flatMap((sc, i) => Array.from(sc.logprobs.slice(prompts[i].length)));
      const exact = generated(await (await load('float32')).score(rows));
      const forward = generated(await model.score(rows));
      const { ok, detail } = noWorseThan(
        ours.flatMap((r) => r.logprobs),
        forward,
        exact,
        ['kernel decode', 'bf16 forward'],
      );
      return verdict(ok, `${device}: ${detail}; ${graphs} CUDA graphs`);
    },
  };
}

/** Packed training rows: three samples of different lengths per row, loss on their second halves. */
function trainRows(seed: number): TrainRow[] {
  const rng = new Rng(seed);
  return [0, 1].map(() => {
    const samples = [40, 25, 63].map((n) => randomTokens(rng, n, CHECK_CONFIG.vocabSize));
    const row = packRow(samples);
    const lossMask = samples.flatMap((s) => s.map((_, t) => (t >= s.length / 2 ? 1 : 0)));
    return { ...row, lossMask };
  });
}
const LR = 1e-3;

/** Largest difference between two weight sets (by name), decoded to float64. */
function weightsDiff(a: WeightTensor[], b: WeightTensor[]): number {
  const byName = new Map(b.map((t) => [t.name, t]));
  let worst = 0;
  for (const t of a) {
    const u = byName.get(t.name);
    if (!u) return Infinity;
    worst = Math.max(worst, maxAbsDiff(decode(t), decode(u)));
  }
  return worst;
}

/**
 * One AdamW step (CE loss) on `device` in `dtype` against the same step in fp32 on the CPU. AdamW's
 * first step moves every weight by about lr whatever the gradient's size, so weights that differ
 * by more than 2 lr took a different step, not a rounded one; loss and gradient norm are compared
 * relatively (fp32: rounding of another summation order; bf16: 8-bit mantissas).
 */
function trainStep(dtype: ComputeDType): Check {
  const fp32 = dtype === 'float32';
  const [lossBound, normBound] = fp32 ? [1e-5, 1e-4] : [2e-2, 5e-2];
  return {
    name: `training step vs fp32 CPU, ${fp32 ? 'fp32' : 'bf16'}`,
    async run(ctx) {
      if (!fp32 && !isCuda(ctx.device)) return NO_CUDA;
      const rows = trainRows(9);
      // bf16 training is mixed precision: fp32 master weights, bf16 matmuls under autocast.
      const step = async (device: string, dt: ComputeDType) => {
        const mixed = dt === 'bfloat16';
        const model = await loadCheckModel(ctx, device, mixed ? 'float32' : dt);
        const trainer = model.createTrainer({ mixedPrecision: mixed ? 'bfloat16' : undefined });
        const stats = await trainer.step(rows, { lr: LR, loss: { kind: 'ce' } });
        return { stats, weights: await trainer.readWeights('F32') };
      };
      const cpu = await step('cpu', 'float32');
      const dev = await step(ctx.device, dtype);
      const lossRel = Math.abs(dev.stats.metrics.loss - cpu.stats.metrics.loss) / Math.abs(cpu.stats.metrics.loss);
      const normRel = Math.abs(dev.stats.metrics.grad_norm - cpu.stats.metrics.grad_norm) / cpu.stats.metrics.grad_norm;
      const w = weightsDiff(dev.weights, cpu.weights);
      // 2 lr is reached exactly where a tiny gradient's sign flipped under rounding: allow its rounding.
      const ok = lossRel <= lossBound && normRel <= normBound && w <= 2 * LR * (1 + 1e-3);
      return verdict(
        ok,
        `loss rel ${fmt(lossRel)} (bound ${lossBound}), grad norm rel ${fmt(normRel)} (bound ${normBound}), weights max ${fmt(w)} (bound 2 lr = ${2 * LR})`,
      );
    },
  };
}

/**
 * LoRA with dropout in bf16 mixed precision, masks drawn on the device: two trainers with the same
 * seed train to the same adapters, and so does one with activation checkpointing (its backward
 * draws the same masks again), while another seed's masks give other adapters. Means over all
 * adapter entries: the flash-attention backward sums in a varying order, so a tiny gradient's sign
 * may round the other way in one entry.
 */
const loraDropout: Check = {
  name: 'LoRA dropout on the device: reproducible, same under activation checkpointing',
  async run(ctx) {
    if (!isCuda(ctx.device)) return NO_CUDA;
    const lora = { rank: 8, alpha: 16, dropout: 0.2, targetModules: ['q_proj', 'v_proj', 'up_proj'] as const };
    const adapters = async (seed: number, activationCheckpointing = 0) => {
      const model = await loadCheckModel(ctx, ctx.device, 'float32');
      const t = model.createTrainer({
        seed,
        lora: { ...lora, targetModules: [...lora.targetModules] },
        mixedPrecision: 'bfloat16',
        activationCheckpointing,
      });
      for (const s of [1, 2]) await t.step(trainRows(s), { lr: LR });
      return t.readAdapters('F32');
    };
    const a = await adapters(1);
    const mean = async (b: Promise<WeightTensor[]>) => {
      const other = new Map((await b).map((t) => [t.name, decode(t)]));
      const flat = (x: WeightTensor[]) => x.flatMap((t) => Array.from(decode(t)));
      return meanAbsDiff(
        flat(a),
        a.flatMap((t) => Array.from(other.get(t.name) ?? [])),
      );
    };
    const [same, checkpointed, otherSeed] = [
      await mean(adapters(1)),
      await mean(adapters(1, 1)),
      await mean(adapters(2)),
    ];
    const ok = same <= 1e-6 && checkpointed <= 1e-6 && otherSeed >= 10 * Math.max(same, checkpointed, 1e-7);
    return verdict(
      ok,
      `mean |adapters - same seed| ${fmt(same)}, with activation checkpointing ${fmt(checkpointed)} (bound 1e-6); other seed ${fmt(otherSeed)} (must be 10x larger)`,
    );
  },
};

/**
 * A checkpoint written on `device` restores on the CPU and one written there restores on `device`:
 * weights equal after each restore, step counts kept, and a step after the restore on both sides
 * lands on the same weights (to fp32 rounding across devices), so AdamW state came along.
 */
const checkpointRoundTrip: Check = {
  name: 'checkpoint device -> CPU -> device',
  async run(ctx) {
    const dir = (n: string) => fs.mkdtempSync(path.join(ctx.workDir, `ckpt-${n}-`));
    const trainer = async (device: string) => (await loadCheckModel(ctx, device, 'float32')).createTrainer({ seed: 1 });
    const a = await trainer(ctx.device);
    for (const seed of [1, 2]) await a.step(trainRows(seed), { lr: LR });
    const d1 = dir('a');
    await a.save(d1);
    const b = await trainer('cpu');
    await b.load(d1);
    const afterLoad = weightsDiff(await b.readWeights('F32'), await a.readWeights('F32'));
    await a.step(trainRows(3), { lr: LR });
    await b.step(trainRows(3), { lr: LR });
    const afterStep = weightsDiff(await b.readWeights('F32'), await a.readWeights('F32'));
    const d2 = dir('b');
    await b.save(d2);
    const c = await trainer(ctx.device);
    await c.load(d2);
    const back = weightsDiff(await c.readWeights('F32'), await b.readWeights('F32'));
    const steps = [a.stepCount, b.stepCount, c.stepCount];
    const ok = afterLoad === 0 && back === 0 && afterStep <= 1e-5 && steps.every((s) => s === 3);
    return verdict(
      ok,
      `restored exactly: ${afterLoad === 0 && back === 0}; after one more step on each: max ${fmt(afterStep)} (bound 1e-5); steps ${steps.join('/')}`,
    );
  },
};

/**
 * The fused kernels (native/src/kernels.h, `fusedKernels`), each against the libtorch path it
 * replaces, forward and backward, on random inputs (native.kernelCheck): every output and input
 * gradient measured against the unfused path run in fp64 on the CPU on the same rounded inputs.
 * fp32: the fused and unfused results within 1e-5 of each other, relative to the result's largest
 * magnitude. bf16: each path rounds differently, so the fused one must be no worse than libtorch's
 * against fp64 (2x its error + 1e-3, as noWorseThan). Shapes: the 0.6B step's widths and heads,
 * odd sizes that take the kernels' scalar (unvectorised) paths and tails, bf16 weights with bf16
 * activations (a bf16 model, and what full sharding gathers), and on a card (cudaOnly: their
 * point is the grid) shapes whose grid-stride loops go past the first grid (a grid is at most 32
 * blocks per multiprocessor for RMSNorm, RoPE and SwiGLU, 16 rows per multiprocessor for the LM
 * head's forward, 65,535 rows for its backward) and the LM head at Qwen3's 151,936-token vocabulary.
 */
type KernelCase = Omit<KernelCheckOptions, 'dtype' | 'device' | 'kernel'> & { cudaOnly?: boolean };
const KERNEL_CASES: Record<string, KernelCase[]> = {
  rmsNorm: [
    { rows: 1000, width: 1024 },
    { rows: 257, heads: 16, width: 128 }, // the q norm: rows of 128 over 16 heads
    { rows: 77, width: 37 },
    { rows: 64, width: 5120 }, // a backward row over several strides of 256 vectors
    { rows: 64, width: 1024, weightDtype: 'bfloat16' },
    { rows: 12000, width: 1024, cudaOnly: true },
    { rows: 4096, heads: 16, width: 128, cudaOnly: true }, // the q norm of a 4,096-token row
  ],
  addRmsNorm: [
    { rows: 1000, width: 1024 },
    { rows: 77, width: 37 },
    { rows: 64, width: 1024, weightDtype: 'bfloat16' },
    { rows: 12000, width: 1024, cudaOnly: true },
  ],
  rope: [
    { rows: 300, heads: 16, kvHeads: 8, width: 128 },
    { rows: 33, heads: 3, kvHeads: 1, width: 6 },
    { rows: 12000, heads: 16, kvHeads: 8, width: 128, cudaOnly: true },
  ],
  swiglu: [
    { rows: 500, width: 3072 },
    { rows: 61, width: 35, packed: true }, // gate and up as the halves of one projection
    { rows: 4096, width: 3072, packed: true, cudaOnly: true },
  ],
  lmHead: [
    { rows: 300, width: 256, vocab: 5000, chunkTokens: 128 },
    { rows: 97, width: 64, vocab: 4099, chunkTokens: 40, entropyGrad: false },
    { rows: 64, width: 64, vocab: 4096, chunkTokens: 32, weightDtype: 'bfloat16' },
    { rows: 40, width: 64, vocab: 151936, chunkTokens: 16, cudaOnly: true },
    { rows: 3000, width: 32, vocab: 300, chunkTokens: 3000, cudaOnly: true },
    { rows: 70000, width: 16, vocab: 40, chunkTokens: 70000, entropyGrad: false, cudaOnly: true },
  ],
};
const KERNEL_NAMES: Record<string, string> = {
  rmsNorm: 'RMSNorm',
  addRmsNorm: 'RMSNorm + residual add',
  rope: 'RoPE',
  swiglu: 'SwiGLU',
  lmHead: 'LM head rows',
};

function kernelCheck(kernel: KernelCheckOptions['kernel'], dtype: 'float32' | 'bfloat16'): Check {
  const fp32 = dtype === 'float32';
  return {
    name: `fused ${KERNEL_NAMES[kernel]} vs libtorch, ${fp32 ? 'fp32' : 'bf16'}`,
    async run(ctx) {
      const failures: string[] = [];
      let worst = { name: '', fused: 0, unfused: 0, apart: 0 };
      let ran = 0;
      for (const [i, { cudaOnly, ...shape }] of KERNEL_CASES[kernel].entries()) {
        if ((cudaOnly && !isCuda(ctx.device)) || (fp32 && shape.weightDtype === 'bfloat16')) continue;
        ran++;
        const rows = native.kernelCheck({ kernel, dtype, device: ctx.device, seed: i + 1, ...shape });
        for (const r of rows) {
          const ok = fp32 ? r.apart <= 1e-5 : r.fused <= 2 * r.unfused + 1e-3;
          const where = `${r.name} of ${JSON.stringify(shape)}`;
          if (!ok) failures.push(`${where}: fused ${fmt(r.fused)}, libtorch ${fmt(r.unfused)}, apart ${fmt(r.apart)}`);
          if ((fp32 ? r.apart : r.fused) >= (fp32 ? worst.apart : worst.fused)) worst = { ...r, name: where };
        }
      }
      const bound = fp32 ? 'fused vs libtorch within 1e-5 relative' : "fused no worse than 2x libtorch's error + 1e-3";
      return verdict(
        failures.length === 0,
        failures.length > 0
          ? `${failures.join('; ')} (${bound})`
          : `${ran} shapes; worst ${worst.name}: vs fp64 fused ${fmt(worst.fused)}, libtorch ${fmt(worst.unfused)}, apart ${fmt(worst.apart)} (${bound})`,
      );
    },
  };
}

/**
 * Scoring and one training step with the fused kernels against the same with libtorch's ops, on
 * the device. fp32: logprobs, loss and gradient norm within 1e-5 relative, and the weights after
 * one AdamW step within 2 lr (trainStep's bound: a tiny gradient whose sign rounds the other way
 * takes the opposite step). bf16 (mixed precision): both against the fp32 CPU step, the fused one
 * no worse than 2x libtorch's error + 1e-5 (loss and gradient norm).
 */
function fusedTrainStep(dtype: ComputeDType): Check {
  const fp32 = dtype === 'float32';
  return {
    name: `scoring and training step, fused kernels vs libtorch, ${fp32 ? 'fp32' : 'bf16'}`,
    async run(ctx) {
      const rows = trainRows(9);
      const mixed = !fp32;
      const side = async (device: string, fusedKernels: boolean, mp: boolean) => {
        const hf = loadHfModel(checkModelDir(ctx));
        const model = await loadModel(hf.config, hf.tensors, { device, dtype: 'float32', fusedKernels });
        const scores = (await model.score(rows)).flatMap((s) => Array.from(s.logprobs));
        const trainer = model.createTrainer({ mixedPrecision: mp ? 'bfloat16' : undefined });
        const stats = await trainer.step(rows, { lr: LR, loss: { kind: 'ce' } });
        return { scores, stats, weights: await trainer.readWeights('F32') };
      };
      const fused = await side(ctx.device, true, mixed);
      const plain = await side(ctx.device, false, mixed);
      const rel = (a: number, b: number) => Math.abs(a - b) / Math.abs(b);
      if (fp32) {
        const scale = Math.max(...plain.scores.map(Math.abs));
        const scoreRel = maxAbsDiff(fused.scores, plain.scores) / scale;
        const lossRel = rel(fused.stats.metrics.loss, plain.stats.metrics.loss);
        const normRel = rel(fused.stats.metrics.grad_norm, plain.stats.metrics.grad_norm);
        const w = weightsDiff(fused.weights, plain.weights);
        return verdict(
          scoreRel <= 1e-5 && lossRel <= 1e-5 && normRel <= 1e-5 && w <= 2 * LR * (1 + 1e-3),
          `logprobs rel ${fmt(scoreRel)}, loss rel ${fmt(lossRel)}, grad norm rel ${fmt(normRel)} (bound 1e-5); weights max ${fmt(w)} (bound 2 lr)`,
        );
      }
      if (!isCuda(ctx.device)) return NO_CUDA;
      const cpu = await side('cpu', false, false);
      const err = (s: { stats: TrainStepStats }) => [
        rel(s.stats.metrics.loss, cpu.stats.metrics.loss),
        rel(s.stats.metrics.grad_norm, cpu.stats.metrics.grad_norm),
      ];
      const [fl, fn] = err(fused),
        [pl, pn] = err(plain);
      return verdict(
        fl <= 2 * pl + 1e-5 && fn <= 2 * pn + 1e-5,
        `vs the fp32 CPU step: fused loss rel ${fmt(fl)}, grad norm rel ${fmt(fn)}; libtorch ${fmt(pl)}, ${fmt(pn)} (bound 2x + 1e-5)`,
      );
    },
  };
}

/**
 * A fully sharded group of one on the device trains to the weights of one trainer, over NCCL (on
 * CUDA) and over Gloo; then the group's collective timing, measured: 8 all-gathers of 64 MiB issued
 * back to back (in a group of one, copies on the collectives' stream). NCCL's are timed on the
 * device: its own start and end events (host clocks read about 0 for it: its future completes when
 * the work is queued), and the waiting stream held between its events around each wait. The check
 * fails a copy rate over 20,000 GB/s (above any card's memory; what a ~0 time gives).
 */
const GATHER_BYTES = 64 << 20,
  GATHERS = 8;
const groupOfOne: Check = {
  name: 'a fully sharded group of one equals one trainer (NCCL and Gloo); collectives timed on the device',
  async run(ctx) {
    const cuda = isCuda(ctx.device);
    if (cuda && !native.info().nccl)
      return verdict(
        false,
        'this build of the addon has no NCCL (c10d ProcessGroupNCCL did not compile at build time)',
      );
    const o: RankOptions = { device: ctx.device, sharding: 'full' };
    const expected = await (await single(o, 3)).trainer.readWeights();
    const parts: string[] = [];
    let ok = true;
    for (const backend of cuda ? (['nccl', 'gloo'] as const) : (['gloo'] as const)) {
      const { ranks } = await joinRanks(1, { ...o, backend });
      for (let s = 0; s < 3; s++) await stepAll(ranks, s);
      const apart = weightsApart(expected, (await readAll(ranks))[0]);
      const t = await native.collectiveTime(ranks[0].group, {
        device: ctx.device,
        bytes: GATHER_BYTES,
        iters: GATHERS,
      });
      const perGather = t.busySeconds / Math.max(1, t.collectives);
      const gbs = (2 * GATHER_BYTES) / Math.max(perGather, 1e-12) / 1e9; // read and written
      ok &&= apart <= 1e-5 && t.collectives === GATHERS && gbs < 20_000 && t.waitSeconds > 0;
      parts.push(
        `${backend}: max |group - one trainer| ${fmt(apart)} (bound 1e-5); ${t.collectives} gathers of 64 MiB, ${(perGather * 1e3).toFixed(3)} ms each (${gbs.toFixed(0)} GB/s copied, bound 20,000), waited ${(t.waitSeconds * 1e3).toFixed(3)} ms`,
      );
    }
    return verdict(ok, parts.join('; ') + (cuda ? '' : '; NCCL: no CUDA'));
  },
};

/** Two fully sharded ranks on one device over Gloo (NCCL takes one rank per device) train to one trainer's weights. */
const twoRanksOneDevice: Check = {
  name: 'two fully sharded ranks on one device over Gloo equal one trainer',
  async run(ctx) {
    const o: RankOptions = { device: ctx.device, backend: 'gloo' };
    const expected = await (await single(o, 3)).trainer.readWeights();
    const { ranks } = await joinRanks(2, { ...o, sharding: 'full' });
    for (let s = 0; s < 3; s++) await stepAll(ranks, s);
    const apart = weightsApart(expected, (await readAll(ranks))[0]);
    return verdict(apart <= 1e-5, `max |two ranks - one trainer| ${fmt(apart)} (bound 1e-5)`);
  },
};

/** Runs a command to its end (output appended to `log`); resolves with its exit code. */
function run(cmd: string, args: string[], log: string, timeoutMs: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const fd = fs.openSync(log, 'a');
    const child = spawn(cmd, args, { cwd: projectRoot, stdio: ['ignore', fd, fd] });
    const timer = setTimeout(() => child.kill('SIGTERM'), timeoutMs);
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      fs.closeSync(fd);
      resolve(code ?? (signal ? 128 : 1));
    });
  });
}

/** `prime-rl rl` (configs/debug/rl.toml, 2 steps) with trainer and inference on the device: it must complete. */
const rlRun: Check = {
  name: 'rl run (2 steps, debug config)',
  async run(ctx) {
    if (!fs.existsSync(temporalCliPath)) return { status: 'skip', detail: `no Temporal CLI at ${temporalCliPath}` };
    const cli = path.join(projectRoot, 'bin', 'prime-rl.js');
    const model = path.join(ctx.workDir, 'rl-model');
    const outputs = path.join(ctx.workDir, 'rl-outputs');
    const log = path.join(ctx.workDir, 'rl.log');
    const created = await run(
      process.execPath,
      [cli, 'model', 'create', '--preset', 'tiny', '--out', model],
      log,
      60_000,
    );
    if (created !== 0) return { status: 'fail', detail: `model create exited ${created} (log: ${log})` };
    const [port, uiPort, httpPort] = [await freePort(), await freePort(), await freePort()];
    const t0 = Date.now();
    // Free ports: never reuse another job's Temporal server or inference port.
    const code = await run(
      process.execPath,
      [
        cli,
        'rl',
        '@',
        path.join(projectRoot, 'configs', 'debug', 'rl.toml'),
        ...['--run-name', 'gpu-check-rl', '--model.name', model, '--output-dir', outputs, '--max-steps', '2'],
        ...['--trainer.model.device', ctx.device, '--inference.model.device', ctx.device],
        ...['--temporal.port', `${port}`, '--temporal.ui-port', `${uiPort}`, '--inference.server.port', `${httpPort}`],
      ],
      log,
      8 * 60_000,
    );
    const metrics = path.join(outputs, 'gpu-check-rl', 'metrics.jsonl');
    const steps = fs.existsSync(metrics) ? fs.readFileSync(metrics, 'utf8').trim().split('\n').length : 0;
    const secs = ((Date.now() - t0) / 1000).toFixed(0);
    return verdict(
      code === 0 && steps === 2,
      `exit ${code}, ${steps}/2 steps in metrics.jsonl, ${secs} s (log: ${log})`,
    );
  },
};

/** Each fused kernel against libtorch, forward and backward, fp32 and bf16. */
export const FUSED_KERNEL_CHECKS: Check[] = (['rmsNorm', 'addRmsNorm', 'rope', 'swiglu', 'lmHead'] as const).flatMap(
  (k) => [kernelCheck(k, 'float32'), kernelCheck(k, 'bfloat16')],
);
/** The paged decode kernel against libtorch's attention. */
export const PAGED_KERNEL_CHECKS: Check[] = [
  pagedKernel('float32', 'check model'),
  pagedKernel('bfloat16', 'check model'),
  pagedKernel('float32', 'wide group'),
  pagedKernel('bfloat16', 'wide group'),
  pagedKernel('float32', 'non-zero device'),
];
/** The data-parallel trainer's groups on the device. */
export const GROUP_CHECKS: Check[] = [groupOfOne, twoRanksOneDevice];

/** In the order they run: the cheap engine checks first, the rl run (minutes) last. */
export const CHECKS: Check[] = [
  logprobsFp32,
  logprobsBf16,
  kvDecode('float32'),
  kvDecode('bfloat16'),
  graphDecode,
  pagedDecode,
  multiStepDecode,
  ...PAGED_KERNEL_CHECKS,
  trainStep('float32'),
  trainStep('bfloat16'),
  loraDropout,
  checkpointRoundTrip,
  ...FUSED_KERNEL_CHECKS,
  fusedTrainStep('float32'),
  fusedTrainStep('bfloat16'),
  ...QWEN35_CHECKS, // Qwen3.5's section (issue #46)
  ...GROUP_CHECKS,
  rlRun,
];

/**
 * Named sets of checks (gpu-checks.js --set): the kernels against libtorch (the plan's first step:
 * bench/gpu/plan.ts), the groups, everything.
 */
export const CHECK_SETS: Record<string, Check[]> = {
  all: CHECKS,
  kernels: [...FUSED_KERNEL_CHECKS, ...PAGED_KERNEL_CHECKS, ...QWEN35_CHECKS],
  groups: GROUP_CHECKS,
};

/** A fresh work dir under the OS temp folder. */
export function makeWorkDir(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'prime-gpu-checks-'));
}

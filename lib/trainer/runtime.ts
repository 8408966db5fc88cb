/**
 * The trainer's in-memory state for one run: the model, its optimizer, and how many train steps
 * it has applied. It is always reconstructible as "latest checkpoint + the stored batches after
 * it": `at(step)` restores and replays deterministically whenever the process is new or behind,
 * so a killed trainer costs a replay, and a batch is never applied twice.
 */
import * as fs from 'node:fs';
import * as native from '../../native';
import { createModelWithoutWeights, loadModel } from '../model/engine';
import { DISK_FULL } from '../atomic';
import { Failure, NonRetryableError, RunFolderDamagedError } from '../failures';
import { resolveModelDir } from '../hub';
import type { DiskDType, WeightTensor } from '../model/arch';
import { loadHfModel, readHfConfig, storedWeightsDtype, writeHfModelStream } from '../model/hf';
import { numel, serializeSafetensors, type TensorEntry } from '../model/safetensors';
import { readBatch, type Batch } from '../runfolder/batch';
import { listSteps, RunLayout } from '../runfolder/layout';
import type { EngineMetrics, TrainMetrics, TrainProgress } from './types';
import { loadBaseShards, loadCheckpoint, writeCheckpoint } from './shards';
import { nextKlBeta } from './kl-controller';
import { lrAt, type LrSchedule } from './schedule';
import { routerReplayRefusal, type TrainerSpec } from './spec';
import type { RankGroup } from './group';

/**
 * The rows rank `rank` of `size` trains of a step: rows go, longest first, to the rank with the
 * fewest tokens yet (ties: the lower rank), so the ranks' forward/backward times are even; each
 * rank keeps its rows in batch order. Deterministic: every rank computes the same split.
 */
export function shardRows<T extends { inputIds: ArrayLike<number> }>(
  rows: readonly T[],
  rank: number,
  size: number,
): T[] {
  if (size === 1) return [...rows];
  const order = rows.map((_, i) => i).sort((a, b) => rows[b].inputIds.length - rows[a].inputIds.length || a - b);
  const load = new Array<number>(size).fill(0);
  const mine: number[] = [];
  for (const i of order) {
    let r = 0;
    for (let k = 1; k < size; k++) if (load[k] < load[r]) r = k;
    load[r] += rows[i].inputIds.length;
    if (r === rank) mine.push(i);
  }
  return mine.sort((a, b) => a - b).map((i) => rows[i]);
}

/**
 * Reads the base model every restore starts from (its config, or its weights). One that no longer
 * loads (its files damaged since the run was prepared) stops the run: every retry would read the
 * same bytes. An I/O error (errno) may pass, and is retried.
 */
function readBaseModel<T>(dir: string, read: (dir: string) => T): T {
  try {
    return read(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== undefined) throw e;
    throw new NonRetryableError(
      `the base model ${dir} (model.name) no longer loads, so the trainer cannot restore: ${(e as Error).message}`,
      Failure.InvalidModel,
    );
  }
}

/**
 * The learning rate of train step `step`: the schedule over the trainer's `maxSteps`, or, resumed
 * with skip_scheduler, a schedule that starts again at the resume step over the steps left.
 */
function lrOf(t: TrainerSpec, step: number): number {
  const from = t.resume?.skipScheduler && step >= t.resume.step ? t.resume.step : 0;
  const schedule: LrSchedule = {
    kind: t.scheduler.type,
    lr: t.optim.lr,
    warmupSteps: t.scheduler.warmup_steps,
    totalSteps: t.maxSteps === undefined ? undefined : t.maxSteps - from,
    minLr: t.scheduler.min_lr,
  };
  return lrAt(schedule, step - from);
}

export interface RestoreReport {
  /** Checkpoint step restored from (0 = the base model). */
  from: number;
  /** Checkpoints found unusable (corrupt or unreadable) and skipped, with why. */
  skipped: string[];
  /** Batches replayed to catch up. */
  replayed: number;
  /** Damaged batches rebuilt from their rollouts on the way, with what was wrong. */
  rebuilt: string[];
}

/**
 * Packs step `step`'s batch of run `runDir` again from its stored rollouts, replacing the file (the
 * same rollouts and settings give the same bytes). The trainer reads batches; how rollouts become
 * one is the orchestrator's (lib/orchestrator/repack.ts), so whoever runs the trainer passes it in.
 */
export type BatchRepacker = (runDir: string, step: number) => Promise<void>;

export interface RestoreOptions {
  onReplay?: (done: number, total: number) => void;
  /** Data parallel: this rank's process group. */
  group?: RankGroup;
  /** Packs a damaged RL batch again; without it, a damaged batch stops the run, naming it. */
  repack?: BatchRepacker;
}

/**
 * Packs step `step`'s batch again from its rollouts after `damage` (`repack`). Where the rollouts
 * are gone (or the run is SFT, whose batches are made once when it is prepared) the run stops,
 * naming the batch.
 */
async function rebuildBatch(
  layout: RunLayout,
  step: number,
  damage: RunFolderDamagedError,
  repack: BatchRepacker | undefined,
): Promise<void> {
  const rollouts = layout.rolloutsFile(step);
  const cannot = (why: string) => new RunFolderDamagedError(damage.file, damage.why, `it cannot be rebuilt: ${why}`);
  if (!fs.existsSync(layout.configFile))
    throw cannot('SFT batches are made once, when the run is prepared; start the run again in a new run folder');
  // The summary is written last: without it the folder is not a finished step's rollouts.
  if (!fs.existsSync(layout.rolloutsSummaryFile(step))) throw cannot(`the step's rollouts (${rollouts}) are gone`);
  if (!repack) throw cannot('this trainer process was given no packer (lib/orchestrator/repack.ts)');
  try {
    await repack(layout.dir, step);
  } catch (e) {
    if ((e as Error).name === DISK_FULL) throw e; // retried once space is freed
    throw cannot(`packing ${rollouts} again failed: ${(e as Error).message}`);
  }
}

/** Weights about to be published hold NaN or Inf (the run diverged): they are not written. */
export class NonFiniteWeightsError extends Error {
  constructor(
    readonly tensor: string,
    readonly count: number,
    readonly size: number,
    version: number,
  ) {
    super(
      `tensor '${tensor}' holds ${count} non-finite values (NaN or Inf) of ${size}: weights/step_${version} not published`,
    );
  }
}

/**
 * How many NaN or Inf values an F32 tensor holds: one pass over its data (about 3 s per billion
 * values on one core), which is already in JS memory to be written.
 */
export function countNonFinite(t: WeightTensor): number {
  if (t.dtype === 'BF16' || t.dtype === 'F16') {
    // NaN and +-Inf are the values whose exponent bits are all set.
    const mask = t.dtype === 'BF16' ? 0x7f80 : 0x7c00;
    const bits =
      t.data.byteOffset % 2 === 0
        ? new Uint16Array(t.data.buffer, t.data.byteOffset, t.data.length / 2)
        : new Uint16Array(Uint8Array.from(t.data).buffer);
    let count = 0;
    for (let i = 0; i < bits.length; i++) if ((bits[i] & mask) === mask) count++;
    return count;
  }
  if (t.dtype !== 'F32') throw new Error(`countNonFinite: tensor ${t.name} is ${t.dtype}, not a float dtype`);
  // A view where the bytes are 4-aligned, else a copy.
  const data =
    t.data.byteOffset % 4 === 0
      ? new Float32Array(t.data.buffer, t.data.byteOffset, t.data.length / 4)
      : new Float32Array(Uint8Array.from(t.data).buffer);
  let count = 0;
  // x - x is 0 for every finite x, NaN for NaN and +-Inf.
  for (let i = 0; i < data.length; i++) if (data[i] - data[i] !== 0) count++;
  return count;
}

/** Throws NonFiniteWeightsError for the first tensor with a NaN or Inf, yielding between tensors (heartbeats). */
async function checkFinite(tensors: readonly WeightTensor[], version: number): Promise<void> {
  for (const t of tensors) {
    const count = countNonFinite(t);
    if (count > 0) throw new NonFiniteWeightsError(t.name, count, numel(t.shape), version);
    await new Promise((r) => setImmediate(r));
  }
}

export class TrainerRuntime {
  private constructor(
    readonly layout: RunLayout,
    readonly spec: TrainerSpec,
    /** The model the trainer trains; kept referenced for as long as the trainer lives. */
    readonly model: native.NativeModel,
    private readonly trainer: native.Trainer,
    private readonly baseDir: string,
    private readonly rawConfig: Record<string, unknown>,
    public progress: TrainProgress,
    /** Data parallel: this rank's process group (steps, checkpoints and restores are collective). */
    readonly group?: RankGroup,
    private readonly repack?: BatchRepacker,
  ) {}

  /** The KL penalty's beta for the next step (see kl-controller): checkpointed, recomputed on replay. */
  klBeta = 0;

  /** Damaged batches this runtime rebuilt from their rollouts (see `batch`), with what was wrong. */
  readonly rebuilt: string[] = [];

  get runDir(): string {
    return this.layout.dir;
  }

  /**
   * A runtime at exactly `step` applied train steps: the newest usable checkpoint at or before
   * it (corrupt ones are reported and skipped), then the stored batches up to `step`.
   */
  static async restore(
    runDir: string,
    t: TrainerSpec,
    step: number,
    { onReplay, group, repack }: RestoreOptions = {},
  ): Promise<{ runtime: TrainerRuntime; report: RestoreReport }> {
    const layout = new RunLayout(runDir);
    if (t.threads) native.setThreads(t.threads);
    const baseDir = resolveModelDir(t.model.name, 'trainer.model.name');
    const { config, rawConfig } = readBaseModel(baseDir, readHfConfig);
    const refusal = t.routerReplay ? routerReplayRefusal(config) : undefined;
    if (refusal) throw new NonRetryableError(refusal, Failure.InvalidConfig);
    // bf16 training is mixed precision: fp32 master weights and optimizer state, bf16 matmuls.
    const bf16 = t.model.dtype === 'bfloat16';
    const options = {
      device: t.model.device,
      dtype: bf16 ? ('float32' as const) : t.model.dtype,
      fusedKernels: t.model.fused_kernels,
    };
    // Fully sharded, no rank holds the whole model: the ranks fill their shards from the folder.
    const sharded = group?.sharding === 'full';
    const model = sharded
      ? await createModelWithoutWeights(config, options)
      : await loadModel(config, readBaseModel(baseDir, loadHfModel).tensors, options);
    const trainer = model.createTrainer({
      mixedPrecision: bf16 ? 'bfloat16' : undefined,
      activationCheckpointing: t.model.ac?.freq ?? 0,
      beta1: t.optim.betas[0],
      beta2: t.optim.betas[1],
      eps: t.optim.eps,
      weightDecay: t.optim.weight_decay,
      seed: t.seed,
      // The KL reference is the initial model: frozen here, before any checkpoint is loaded.
      reference: t.klPenalty.enabled,
      lora: t.lora.enabled
        ? { rank: t.lora.rank, alpha: t.lora.alpha, dropout: t.lora.dropout, targetModules: t.lora.target_modules }
        : undefined,
    });
    if (group) trainer.setGroup(group.group, { bucketBytes: group.bucketBytes, sharding: group.sharding });
    if (sharded) await loadBaseShards(trainer, baseDir, config);
    const runtime = new TrainerRuntime(
      layout,
      t,
      model,
      trainer,
      baseDir,
      rawConfig,
      { steps: 0, samples: 0, tokens: 0 },
      group,
      repack,
    );
    runtime.klBeta = t.klPenalty.beta;
    const report: RestoreReport = { from: 0, skipped: [], replayed: 0, rebuilt: runtime.rebuilt };
    const candidates = fs.existsSync(layout.checkpointsRoot) ? listSteps(fs.readdirSync(layout.checkpointsRoot)) : [];
    for (const c of candidates.filter((s) => s <= step).reverse()) {
      const dir = layout.checkpointDir(c);
      try {
        const meta = await loadCheckpoint(trainer, dir);
        // The checkpoint a resume skips the optimizer state of: its weights, AdamW afresh.
        if (t.resume?.skipOptimizer && c === t.resume.step) await trainer.resetOptimizer();
        runtime.progress = { steps: meta.steps, samples: meta.samples, tokens: meta.tokens };
        runtime.klBeta = meta.klBeta ?? t.klPenalty.beta;
        report.from = c;
        break;
      } catch (e) {
        report.skipped.push(`${dir}: ${(e as Error).message}`);
      }
    }
    const total = step - runtime.progress.steps;
    while (runtime.progress.steps < step) {
      await runtime.train(runtime.progress.steps);
      report.replayed++;
      onReplay?.(report.replayed, total);
    }
    return { runtime, report };
  }

  /** Applies batch `step` (which must be the next one) and returns its metrics. */
  async train(step: number): Promise<TrainMetrics> {
    if (step !== this.progress.steps)
      throw new Error(`trainer is at step ${this.progress.steps}, asked to train step ${step}`);
    const t = this.spec;
    const loadStart = performance.now();
    const batch = await this.batch(step);
    const load = (performance.now() - loadStart) / 1000;
    const lr = lrOf(t, step);
    const klBeta = t.klPenalty.enabled ? this.klBeta : 0;
    const rows = this.group ? shardRows(batch.rows, this.group.rank, this.group.size) : batch.rows;
    const stats = await this.trainer.step(
      rows.map((r) => ({
        inputIds: r.inputIds,
        positionIds: r.positionIds,
        lossMask: r.lossMask,
        advantages: r.advantages,
        inferenceLogprobs: r.logprobs,
        ...(r.ceWeights ? { ceWeights: r.ceWeights } : {}),
        // Replay: the experts inference used (-1: the router decides); without, the router decides everywhere.
        ...(t.routerReplay && r.routes ? { routes: r.routes } : {}),
      })),
      { lr, maxGradNorm: t.optim.max_norm, loss: { ...t.loss, klBeta } },
    );
    const engine = stats.metrics as unknown as EngineMetrics;
    this.klBeta = nextKlBeta(t.klPenalty, this.klBeta, engine.kl_divergence);
    this.progress = {
      steps: step + 1,
      samples: this.progress.samples + batch.counts.samples,
      tokens: this.progress.tokens + batch.counts.tokens,
    };
    return {
      ...engine,
      kl_beta: klBeta,
      lr,
      seconds: { load, replay: 0, train: stats.seconds, save: 0 },
    };
  }

  /**
   * Batch `step`. A damaged one (truncated, corrupt, gone) is rebuilt from the step's rollouts;
   * where it cannot be, the run stops with `RunFolderDamaged` naming it: a retry would read the
   * same bytes.
   */
  private async batch(step: number): Promise<Batch> {
    try {
      return readBatch(this.layout.batchFile(step));
    } catch (e) {
      if (!(e instanceof RunFolderDamagedError)) throw e;
      await rebuildBatch(this.layout, step, e, this.repack);
      this.rebuilt.push(`${e.message}; rebuilt from ${this.layout.rolloutsDir(step)}`);
      return readBatch(this.layout.batchFile(step));
    }
  }

  /**
   * Cross-entropy of the current model on stored batches (SFT validation), without updating it:
   * the mean of -log p over the tokens whose loss mask is 1.
   */
  async validationLoss(files: readonly string[]): Promise<{ loss: number; tokens: number }> {
    let sum = 0;
    let tokens = 0;
    for (const file of files) {
      const rows = readBatch(file).rows;
      const scores = await this.trainer.score(rows, { temperature: 1 });
      rows.forEach((row, r) => {
        for (let t = 0; t < row.lossMask.length; t++) {
          if (row.lossMask[t] === 0) continue;
          sum -= scores[r].logprobs[t];
          tokens++;
        }
      });
    }
    return { loss: tokens > 0 ? sum / tokens : NaN, tokens };
  }

  /** Whether every rank takes part in computing weights and scores (full sharding gathers the parameters). */
  get collective(): boolean {
    return this.group?.sharding === 'full';
  }

  /**
   * Writes the current weights as HF folder `weights/step_<version>` (what inference loads: with
   * LoRA, the merged weights), plus the adapters in PEFT layout under `lora/` when LoRA is on.
   * The weights are written unit by unit (the embedding, each layer, ...) as the trainer hands
   * them over (under full sharding, as the ranks gather them: then every rank calls this or
   * `shareWeights`, and rank 0 writes). Weights with a NaN or Inf are refused
   * (NonFiniteWeightsError), so a diverged run never hands them to inference.
   */
  async writeWeights(
    version: number,
    onUnit?: (unit: number, tensors: readonly WeightTensor[]) => Promise<void>,
  ): Promise<string> {
    const dir = this.layout.weightsDir(version);
    const lora = this.spec.lora;
    const adapters = lora.enabled ? await this.trainer.readAdapters('F32') : [];
    await checkFinite(adapters, version);
    const files: Record<string, string | Buffer> = {};
    if (lora.enabled) {
      files['lora/adapter_model.safetensors'] = serializeSafetensors(adapters);
      files['lora/adapter_config.json'] = JSON.stringify(
        {
          peft_type: 'LORA',
          task_type: 'CAUSAL_LM',
          base_model_name_or_path: this.baseDir,
          r: lora.rank,
          lora_alpha: lora.alpha,
          lora_dropout: lora.dropout,
          target_modules: lora.target_modules,
          bias: 'none',
          fan_in_fan_out: false,
          inference_mode: true,
        },
        null,
        2,
      );
    }
    // In the base model's dtype (bf16 for a bf16 model: half of fp32's bytes, what the servers
    // would hold anyway); each unit is checked as it comes and handed to `onUnit` (a broadcast to
    // the servers) while it is written.
    const dtype = this.weightsDtype;
    const trainer = this.trainer;
    const entries = this.policyUnits().flat();
    async function* units() {
      for (let u = 0; u < trainer.weightUnits; u++) {
        const tensors = await trainer.readWeightUnit(u, dtype);
        await checkFinite(tensors, version);
        // The broadcast of a unit (a native thread's collective) overlaps its write.
        const sent = onUnit?.(u, tensors);
        yield tensors;
        await sent;
      }
    }
    await writeHfModelStream(dir, { config: this.rawConfig, entries, batches: units(), copyFrom: this.baseDir, files });
    return dir;
  }

  /** The tensors `writeWeights` writes, unit by unit (what a broadcast announces). */
  policyUnits(): TensorEntry[][] {
    const dtype = this.weightsDtype;
    return this.trainer.shardLayout().units.map((u) => u.params.map((p) => ({ name: p.name, dtype, shape: p.shape })));
  }

  /** The dtype policy weights are written in: the base model's (storedWeightsDtype). */
  get weightsDtype(): DiskDType {
    return (this.cachedWeightsDtype ??= storedWeightsDtype(this.baseDir));
  }
  private cachedWeightsDtype?: DiskDType;

  /** A rank > 0's part of `writeWeights` under full sharding: every unit gathered with rank 0. */
  async shareWeights(): Promise<void> {
    for (let u = 0; u < this.trainer.weightUnits; u++) await this.trainer.readWeightUnit(u, this.weightsDtype);
  }

  /**
   * Saves `checkpoints/step_<steps>` atomically, with a checksum. Data parallel: a collective in
   * which rank 0 gathers the optimizer shards and alone writes.
   */
  async checkpoint(): Promise<string> {
    const dir = this.layout.checkpointDir(this.progress.steps);
    const klBeta = this.spec.klPenalty.enabled ? { klBeta: this.klBeta } : {};
    await writeCheckpoint(this.trainer, dir, this.group?.rank ?? 0, { ...this.progress, ...klBeta });
    return dir;
  }
}

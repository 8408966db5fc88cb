/**
 * What the trainer needs to know, whichever workflow drives it: RL (policy losses on rollouts)
 * and SFT (cross-entropy on demonstrations) both train through the same TrainerRuntime; and the
 * trainer's view of a run folder (`readTrainingSpec`).
 */
import * as fs from 'node:fs';
import type * as native from '../../native';
import { lossKindSpec } from '../../native/loss-kinds';
import type { RLConfig, SFTConfig, TrainerConfig } from '../config/schemas';
import { Failure, NonRetryableError } from '../failures';
import type { ArchConfig } from '../model/arch';
import { readRunConfig, readSftConfig, readSftPlan } from '../runfolder/config';
import { RunLayout } from '../runfolder/layout';
import type { KlPenalty } from './kl-controller';

export interface TrainerSpec {
  model: TrainerConfig['model'];
  optim: TrainerConfig['optim'] & { lr: number };
  scheduler: TrainerConfig['scheduler'];
  lora: TrainerConfig['lora'];
  seed: number;
  threads?: number;
  /** Horizon of the linear and cosine schedules. */
  maxSteps?: number;
  /** The loss; its klBeta is set per step by the runtime from klPenalty. */
  loss: native.LossConfig;
  klPenalty: KlPenalty;
  /** MoE router replay: train each token through the experts inference routed it to (batch routes). */
  routerReplay?: boolean;
  /**
   * `ckpt.resume_step` with `skip_optimizer` / `skip_scheduler`: the checkpoint of that step is
   * restored with AdamW afresh, and the learning-rate schedule starts again there.
   */
  resume?: { step: number; skipOptimizer: boolean; skipScheduler: boolean };
}

/** The resume settings of a run's [ckpt], when it skips part of the checkpoint. */
function resumeOf(ckpt: {
  resume_step?: number;
  skip_optimizer?: boolean;
  skip_scheduler?: boolean;
}): Pick<TrainerSpec, 'resume'> {
  const skipOptimizer = ckpt.skip_optimizer === true;
  const skipScheduler = ckpt.skip_scheduler === true;
  return ckpt.resume_step !== undefined && (skipOptimizer || skipScheduler)
    ? { resume: { step: ckpt.resume_step, skipOptimizer, skipScheduler } }
    : {};
}

/** Why `trainer.moe.router_replay` cannot apply to a model of `arch`, or undefined when it can. */
export function routerReplayRefusal(arch: ArchConfig): string | undefined {
  return arch.moe
    ? undefined
    : `trainer.moe.router_replay: the model (${arch.arch}) has no MoE router to replay; set it to false or use a MoE model`;
}

/** The RL trainer: the configured policy loss, logits at the sampling temperature. */
export function rlTrainerSpec(c: RLConfig): TrainerSpec {
  const t = c.trainer;
  return {
    model: t.model,
    optim: t.optim,
    scheduler: t.scheduler,
    lora: t.lora,
    seed: t.seed,
    threads: t.threads,
    maxSteps: t.max_steps,
    loss: {
      kind: t.loss.type,
      // Greedy sampling (temperature 0) reports temperature-1 logprobs, so the trainer uses 1 too.
      temperature: c.orchestrator.sampling.temperature || 1,
      normalization: t.loss.normalization,
      // The type's parameters, filled from their defaults by the schema.
      params: Object.fromEntries(
        lossKindSpec(t.loss.type).params.map((p) => [p.name, (t.loss as Record<string, unknown>)[p.name] as number]),
      ),
      mismatch: {
        mode: t.loss.mismatch.mode,
        tisCap: t.loss.mismatch.tis_cap,
        tokenLow: t.loss.mismatch.token_low,
        tokenHigh: t.loss.mismatch.token_high,
        seqLow: t.loss.mismatch.seq_low,
        seqHigh: t.loss.mismatch.seq_high,
      },
      routerAuxLossCoef: t.moe.router_aux_loss_coef,
    },
    klPenalty: { enabled: t.kl_penalty.enabled, beta: t.kl_penalty.beta, targetKl: t.kl_penalty.target_kl },
    routerReplay: t.moe.router_replay,
    ...resumeOf(c.ckpt),
  };
}

/** The SFT trainer: cross-entropy on the loss-masked tokens, over the run's `totalSteps`. */
export function sftTrainerSpec(c: SFTConfig, totalSteps: number): TrainerSpec {
  return {
    model: c.model,
    optim: c.optim,
    scheduler: c.scheduler,
    lora: c.lora,
    seed: c.seed,
    threads: c.threads,
    maxSteps: totalSteps,
    loss: { kind: 'ce', routerAuxLossCoef: c.moe.router_aux_loss_coef },
    klPenalty: { enabled: false, beta: 0 },
    ...resumeOf(c.ckpt),
  };
}

/** What the trainer activities need of a run: how to train, and what to keep. */
export interface RunTrainingSpec {
  trainer: TrainerSpec;
  keepLast?: number;
  /** Policy versions behind the newest that in-flight rollouts may still need (0 for SFT). */
  asyncLevel: number;
  /** Whether train step `version - 1` writes HF weights `weights/step_<version>`. */
  writesWeights(version: number): boolean;
}

/** The trainer's view of a run folder: an SFT run (configs/sft.json) or an RL run (configs/rl.json). */
export function readTrainingSpec(runDir: string): RunTrainingSpec {
  const layout = new RunLayout(runDir);
  if (fs.existsSync(layout.sftConfigFile)) {
    const c = readSftConfig(runDir);
    const plan = readSftPlan(runDir);
    if (!plan)
      throw new NonRetryableError(
        `SFT run ${layout.dir} has no ${layout.sftPlanFile}: was it prepared?`,
        Failure.MissingSftPlan,
      );
    return {
      trainer: sftTrainerSpec(c, plan.steps),
      keepLast: c.ckpt.keep_last,
      asyncLevel: 0,
      // Nothing samples from an SFT run while it trains: weights at checkpoints and at the end.
      writesWeights: (v) => v % c.ckpt.interval === 0 || v === plan.steps,
    };
  }
  const c = readRunConfig(runDir);
  // Every policy version is served to the rollouts of a later step.
  return {
    trainer: rlTrainerSpec(c),
    keepLast: c.ckpt.keep_last,
    asyncLevel: c.async_level,
    writesWeights: () => true,
  };
}

/**
 * A step's trainer input from its stored rollouts (the groups the rollout filters kept): errored
 * rollouts dropped, each group's advantages by its environment's algorithm (docs/algorithms.md:
 * a group estimator, or rae; zero ones dropped with filter_zero_advantages; every sample of a
 * rollout gets its advantage), distillation's per-token terms, cross-entropy weights (echo's
 * observation tokens, a teacher's tokens in sft distillation), samples packed first-fit-decreasing
 * into rows of seq_len, written as one batch file. CPU-bound (seconds for thousands of long
 * rollouts), so `packBatch` runs it in a worker thread (lib/thread.ts): it imports only what it needs.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { writeFileAtomic } from '../atomic';
import type { RLConfig } from '../config/schemas';
import { RunFolderDamagedError } from '../failures';
import type { RunLayout } from '../runfolder/layout';
import { computeAdvantages, emptyAdvantageMetrics, raeAdvantages, type AdvantageMetrics } from './advantages';
import { readBatch, writeBatch } from '../runfolder/batch';
import type { DistillBaseline, DistillType } from '../config/names';
import { positionBaselines, teacherKl } from './distill';
import { echoWeights, type EchoRoles } from './echo';
import { packSamples, type PackCounts, type Sample, type TokenSegment } from '../runfolder/packing';
import { buildSample } from './sample';
import { advantageEstimator, type AdvantageConfig } from './plugins';

/** What packing needs of a stored rollout (one line of rollouts.jsonl). */
interface RolloutLine {
  group: number;
  /** The [[env]] entry it was drawn from; absent in rollouts stored before it was recorded. */
  envIndex?: number;
  env?: string;
  reward: number;
  completionTokens: number;
  turns: number;
  /** A rollout's samples share its advantage: the group counts rollouts, not samples. */
  samples?: TokenSegment[][];
  /** Rollouts stored before a rollout could hold several samples: its one sample. */
  segments?: TokenSegment[];
  /** The agents' traces of a multi-agent episode, in sample order (rae's baselines are per agent). */
  traces?: { agent: string; reward: number; samples: number }[];
  error?: string;
}

/** One environment's algorithm (`[[env]]` overrides over the run's). */
export interface EnvAlgorithm {
  /** The environment's id: rollouts stored without `envIndex` are matched by it. */
  id: string;
  advantage: AdvantageConfig;
  /** Distillation; opd and opsd add a teacher term to each token's advantage, sft trains by cross-entropy. */
  distill?: { type: DistillType; weight: number; baseline: DistillBaseline };
  /** Echo's role weights. */
  echo?: EchoRoles;
}

export interface StepBatchInput {
  step: number;
  /** rollouts.jsonl of the step. */
  rolloutsFile: string;
  /** The batch file to write (kept when it exists and is sound: the rollouts determine it). */
  batchFile: string;
  /** Tokens per packed row (the trainer's seq_len, at least the orchestrator's). */
  seqLen: number;
  /** The run's advantage estimator (every environment's, without `envs`). */
  advantage: AdvantageConfig;
  /** Rollouts with an advantage of exactly 0 are not trained on by the policy loss. */
  filterZeroAdvantages: boolean;
  /** Online distillation of every environment (without `envs`): per-token advantages, see `buildSample`. */
  distill?: { weight: number; baseline: DistillBaseline; type?: DistillType };
  /** Each [[env]] entry's algorithm, by index; unset = `advantage` and `distill` for all. */
  envs?: EnvAlgorithm[];
  /** rae: the baselines before this step (the previous step's file; none at step 0) and after it. */
  rae?: { before?: string; after: string };
}

export interface StepBatchResult {
  counts: PackCounts;
  advantages: AdvantageMetrics;
  /** Distilling: the step's mean reverse KL to the teacher over the tokens it scored (lib/orchestrator/distill.ts). */
  distill?: { teacher_kl: number; tokens: number };
  /** rae: the baselines after the step, by environment and agent. */
  rae?: Record<string, number>;
}

/** Each [[env]] entry's algorithm: its own parts, or the run's. */
export function envAlgorithms(config: RLConfig): EnvAlgorithm[] {
  const o = config.orchestrator;
  return config.env.map((e) => {
    const d = e.distill ?? config.distill;
    const distilling = d !== false && d !== undefined && (d.type === 'opsd' || d.teacher !== undefined);
    const echo = e.echo ?? o.echo;
    return {
      id: e.id,
      advantage: e.advantage ?? o.advantage,
      ...(distilling ? { distill: { type: d.type, weight: d.weight, baseline: d.baseline } } : {}),
      ...(echo ? { echo: echo.roles } : {}),
    };
  });
}

/**
 * Step `step`'s packing input from the run's config: what `packBatch` packs, and what the trainer
 * packs again to rebuild a damaged batch (the same rollouts and settings give the same bytes).
 */
export function stepBatchInput(config: RLConfig, layout: RunLayout, step: number): StepBatchInput {
  const o = config.orchestrator;
  const envs = envAlgorithms(config);
  const rae = envs.some((e) => e.advantage.type === 'rae');
  return {
    step,
    rolloutsFile: layout.rolloutsFile(step),
    batchFile: layout.batchFile(step),
    // Rows of the trainer's seq_len hold the orchestrator's samples (at most its seq_len each).
    seqLen: Math.max(config.trainer.seq_len, o.seq_len),
    advantage: o.advantage,
    filterZeroAdvantages: o.filter_zero_advantages,
    envs,
    ...(rae
      ? { rae: { ...(step > 0 ? { before: raeStateFile(layout, step - 1) } : {}), after: raeStateFile(layout, step) } }
      : {}),
  };
}

/** rae's baselines after step `step` (beside its batch; rewinding or pruning the batches keeps them apart). */
export function raeStateFile(layout: RunLayout, step: number): string {
  return path.join(path.dirname(layout.batchFile(step)), `rae_${step}.json`);
}

/** The stored batch's counts, or undefined when it is absent or damaged (then it is packed again). */
function storedCounts(file: string): PackCounts | undefined {
  if (!fs.existsSync(file)) return undefined;
  try {
    return readBatch(file).counts;
  } catch (e) {
    if (e instanceof RunFolderDamagedError) return undefined;
    throw e;
  }
}

/** A step's stored rollouts; a line that does not parse is damage (every retry would read it). */
function readRolloutLines(file: string): RolloutLine[] {
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .flatMap((l, i) => {
      if (l === '') return [];
      try {
        return [JSON.parse(l) as RolloutLine];
      } catch (e) {
        throw new RunFolderDamagedError(file, `line ${i + 1} is not JSON (${(e as Error).message})`);
      }
    });
}

/** rae's baselines before the step: the previous step's file (none: all 0, the start). */
function raeBaselinesBefore(input: StepBatchInput): Record<string, number> {
  const file = input.rae?.before;
  if (file === undefined) return {};
  if (!fs.existsSync(file))
    throw new RunFolderDamagedError(
      file,
      "rae's baselines after the previous step are missing (step n's advantages continue its EMA): the run folder lost them",
    );
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, number>;
  } catch (e) {
    throw new RunFolderDamagedError(file, `not JSON (${(e as Error).message})`);
  }
}

/** Progress the thread reports (heartbeat details of `packBatch`). */
export interface StepBatchProgress {
  phase: 'reading' | 'advantages' | 'packing' | 'writing';
  step: number;
}

function addMetrics(into: AdvantageMetrics, m: AdvantageMetrics): void {
  for (const k of Object.keys(into) as (keyof AdvantageMetrics)[]) into[k] += m[k];
}

export function buildStepBatch(
  input: StepBatchInput,
  progress: (p: StepBatchProgress) => void = () => {},
): StepBatchResult {
  const { step } = input;
  progress({ phase: 'reading', step });
  const rollouts = readRolloutLines(input.rolloutsFile);
  progress({ phase: 'advantages', step });
  const byGroup = new Map<number, RolloutLine[]>();
  for (const r of rollouts) {
    const g = byGroup.get(r.group);
    if (g) g.push(r);
    else byGroup.set(r.group, [r]);
  }
  const groups = [...byGroup.keys()].sort((a, b) => a - b).map((g) => byGroup.get(g)!);
  const samplesOf = (r: RolloutLine) => r.samples ?? [r.segments!];
  const tokens = (r: RolloutLine) =>
    samplesOf(r)
      .flat()
      .reduce((n, s) => n + s.tokens.length, 0);
  const fallback: EnvAlgorithm = {
    id: '',
    advantage: input.advantage,
    ...(input.distill ? { distill: { type: 'opd' as const, ...input.distill } } : {}),
  };
  /** A group's environment and its algorithm. */
  const envOf = (g: RolloutLine[]): { index: number; algo: EnvAlgorithm } => {
    const envs = input.envs;
    if (!envs || envs.length === 0) return { index: 0, algo: fallback };
    const r = g[0];
    const index =
      r.envIndex ??
      Math.max(
        0,
        envs.findIndex((e) => e.id === r.env),
      );
    return { index, algo: envs[index] ?? fallback };
  };
  const estimators = new Map<number, ReturnType<typeof advantageEstimator>>();
  const metrics = emptyAdvantageMetrics();
  const baselines = raeBaselinesBefore(input);
  const raeUsed = input.rae !== undefined;
  // Per group, per rollout: the advantage of each of its samples, or null when it is not trained.
  const advantages: (number[] | null)[][] = groups.map((g) => {
    const { index, algo } = envOf(g);
    const samples = g.map((r) => samplesOf(r).length);
    if (algo.advantage.type === 'rae') {
      // Every valid rollout's traces, in order, each against its agent's baseline of this environment.
      const m = emptyAdvantageMetrics();
      m.groups = 1;
      m.rollouts = g.length;
      const out = g.map((r, ri) => {
        if (r.error !== undefined) {
          m.rollouts_errored++;
          return null;
        }
        const traces = r.traces ?? [{ agent: 'agent', reward: r.reward, samples: samples[ri] }];
        const adv = raeAdvantages(
          traces.map((t) => ({ key: `${index}/${t.agent}`, reward: t.reward })),
          baselines,
          algo.advantage.decay ?? 0.95,
        );
        m.rollouts_kept++;
        return traces.flatMap((t, ti) => Array.from({ length: t.samples }, () => adv[ti]));
      });
      m.groups_kept = out.some((a) => a !== null) ? 1 : 0;
      addMetrics(metrics, m);
      return out;
    }
    let estimator = estimators.get(index);
    if (!estimator) estimators.set(index, (estimator = advantageEstimator(algo.advantage)));
    // Distillation's teacher term and echo's observation tokens train a rollout whose advantage is 0.
    const keepZero = algo.distill !== undefined || algo.echo !== undefined;
    const result = computeAdvantages(
      [
        g.map((r) => ({
          reward: r.reward,
          completionTokens: r.completionTokens,
          inputTokens: tokens(r) - r.completionTokens,
          turns: r.turns,
          errored: r.error !== undefined,
        })),
      ],
      estimator,
      { dropZeroAdvantage: input.filterZeroAdvantages && !keepZero },
    );
    addMetrics(metrics, result.metrics);
    // sft: the teacher's samples train by cross-entropy, whatever their group's rewards.
    if (algo.distill?.type === 'sft')
      return g.map((r, ri) => (r.error === undefined ? Array.from({ length: samples[ri] }, () => 0) : null));
    return result.advantages[0].map((a, ri) => (a === null ? null : Array.from({ length: samples[ri] }, () => a)));
  });
  const distilled = groups.flatMap((g, gi) => {
    const d = envOf(g).algo.distill;
    return d && d.type !== 'sft' ? g.filter((_, ri) => advantages[gi][ri] !== null) : [];
  });
  const distill = distilled.length > 0 ? teacherKl(distilled.flatMap(samplesOf)) : undefined;
  // Before the batch: a stored batch implies its step's baselines are stored too.
  if (input.rae) writeFileAtomic(input.rae.after, `${JSON.stringify(baselines)}\n`);
  // Written by an earlier attempt: the rollouts determine it, so the stored one is this step's
  // batch, unless it is damaged: then it is packed again, to the same bytes.
  const stored = storedCounts(input.batchFile);
  const rae = raeUsed ? baselines : undefined;
  if (stored) return { counts: stored, advantages: metrics, distill, ...(rae ? { rae } : {}) };
  progress({ phase: 'packing', step });
  const out: Sample[] = [];
  for (const [gi, g] of groups.entries()) {
    const { algo } = envOf(g);
    const d = algo.distill;
    // Leave-one-out over the group's valid rollouts, trained or not: each was sampled independently.
    const valid = g.filter((r) => r.error === undefined);
    const baselinesOf =
      d && d.type !== 'sft' && d.baseline === 'position' ? positionBaselines(valid.map(samplesOf)) : undefined;
    g.forEach((r, ri) => {
      const adv = advantages[gi][ri];
      if (adv === null) return;
      samplesOf(r).forEach((segments, s) => {
        const sample = buildSample(
          segments,
          adv[s],
          d && d.type !== 'sft' ? { weight: d.weight, baseline: baselinesOf?.[valid.indexOf(r)]?.[s] } : undefined,
        );
        if (d?.type === 'sft') {
          // The teacher's tokens: cross-entropy on each, no policy term (they are not the policy's samples).
          sample.ceWeights = Float32Array.from(sample.lossMask);
          sample.lossMask = new Uint8Array(sample.lossMask.length);
        } else if (algo.echo) {
          const w = echoWeights(segments, algo.echo);
          if (w.some((x) => x > 0)) sample.ceWeights = w;
          // A zero advantage carries no policy-gradient signal: its tokens train by their echo weights alone.
          if (adv[s] === 0 && input.filterZeroAdvantages && !d) {
            sample.lossMask = new Uint8Array(sample.lossMask.length);
            if (!sample.ceWeights) return;
          }
        }
        out.push(sample);
      });
    });
  }
  // Every sample carries cross-entropy weights when one does (the batch's rows all have the stream).
  if (out.some((x) => x.ceWeights)) for (const x of out) x.ceWeights ??= new Float32Array(x.inputIds.length);
  const { rows, counts } = packSamples(out, input.seqLen);
  progress({ phase: 'writing', step });
  fs.mkdirSync(path.dirname(input.batchFile), { recursive: true });
  writeBatch(input.batchFile, step, input.seqLen, rows, counts);
  return { counts, advantages: metrics, distill, ...(rae ? { rae } : {}) };
}

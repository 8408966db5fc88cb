/**
 * A step's trainer input from its stored rollouts (the groups the rollout filters kept): errored
 * rollouts dropped, advantages per group of rollouts (zero ones dropped with filter_zero_advantages;
 * every sample of a rollout gets its advantage), samples packed first-fit-decreasing into rows of
 * seq_len, written as one batch file. CPU-bound (seconds for thousands of long rollouts), so `packBatch` runs it in a
 * worker thread (lib/thread.ts): it imports only what it needs.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { RLConfig } from '../config/schemas';
import { RunFolderDamagedError } from '../failures';
import type { RunLayout } from '../runfolder/layout';
import { computeAdvantages, type AdvantageMetrics } from './advantages';
import { readBatch, writeBatch } from '../runfolder/batch';
import { positionBaselines, teacherKl, type DistillBaseline } from './distill';
import { packSamples, type PackCounts, type Sample, type TokenSegment } from '../runfolder/packing';
import { buildSample } from './sample';
import { advantageEstimator, type AdvantageConfig } from './plugins';

/** What packing needs of a stored rollout (one line of rollouts.jsonl). */
interface RolloutLine {
  group: number;
  reward: number;
  completionTokens: number;
  turns: number;
  /** A rollout's samples share its advantage: the group counts rollouts, not samples. */
  samples?: TokenSegment[][];
  /** Rollouts stored before a rollout could hold several samples: its one sample. */
  segments?: TokenSegment[];
  error?: string;
}

export interface StepBatchInput {
  step: number;
  /** rollouts.jsonl of the step. */
  rolloutsFile: string;
  /** The batch file to write (kept when it exists and is sound: the rollouts determine it). */
  batchFile: string;
  seqLen: number;
  advantage: AdvantageConfig;
  /** Rollouts with an advantage of exactly 0 are not packed (unless distilling: the teacher term is not 0). */
  filterZeroAdvantages: boolean;
  /** Online distillation (`[distill]` with a teacher): per-token advantages, see `buildSample`. */
  distill?: { weight: number; baseline: DistillBaseline };
}

export interface StepBatchResult {
  counts: PackCounts;
  advantages: AdvantageMetrics;
  /** Distilling: the step's mean reverse KL to the teacher over the tokens it scored (lib/orchestrator/distill.ts). */
  distill?: { teacher_kl: number; tokens: number };
}

/**
 * Step `step`'s packing input from the run's config: what `packBatch` packs, and what the trainer
 * packs again to rebuild a damaged batch (the same rollouts and settings give the same bytes).
 */
export function stepBatchInput(config: RLConfig, layout: RunLayout, step: number): StepBatchInput {
  const o = config.orchestrator;
  return {
    step,
    rolloutsFile: layout.rolloutsFile(step),
    batchFile: layout.batchFile(step),
    seqLen: o.seq_len,
    advantage: o.advantage,
    filterZeroAdvantages: o.filter_zero_advantages,
    // `?.`: run configs stored before distillation existed have no such section.
    ...(config.distill?.teacher
      ? { distill: { weight: config.distill.weight, baseline: config.distill.baseline ?? 'none' } }
      : {}),
  };
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

/** Progress the thread reports (heartbeat details of `packBatch`). */
export interface StepBatchProgress {
  phase: 'reading' | 'advantages' | 'packing' | 'writing';
  step: number;
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
  const result = computeAdvantages(
    groups.map((g) =>
      g.map((r) => ({
        reward: r.reward,
        completionTokens: r.completionTokens,
        inputTokens: tokens(r) - r.completionTokens,
        turns: r.turns,
        errored: r.error !== undefined,
      })),
    ),
    advantageEstimator(input.advantage),
    { dropZeroAdvantage: input.filterZeroAdvantages && input.distill === undefined },
  );
  const trained = groups.flatMap((g, gi) => g.filter((_, ri) => result.advantages[gi][ri] !== null));
  const distill = input.distill ? teacherKl(trained.flatMap(samplesOf)) : undefined;
  // Written by an earlier attempt: the rollouts determine it, so the stored one is this step's
  // batch, unless it is damaged: then it is packed again, to the same bytes.
  const stored = storedCounts(input.batchFile);
  if (stored) return { counts: stored, advantages: result.metrics, distill };
  progress({ phase: 'packing', step });
  const samples: Sample[] = [];
  for (const [gi, g] of groups.entries()) {
    // Leave-one-out over the group's valid rollouts, trained or not: each was sampled independently.
    const valid = g.filter((r) => r.error === undefined);
    const baselines = input.distill?.baseline === 'position' ? positionBaselines(valid.map(samplesOf)) : undefined;
    g.forEach((r, ri) => {
      const advantage = result.advantages[gi][ri];
      if (advantage === null) return;
      samplesOf(r).forEach((segments, s) =>
        samples.push(
          buildSample(
            segments,
            advantage,
            input.distill && { weight: input.distill.weight, baseline: baselines?.[valid.indexOf(r)]?.[s] },
          ),
        ),
      );
    });
  }
  const { rows, counts } = packSamples(samples, input.seqLen);
  progress({ phase: 'writing', step });
  fs.mkdirSync(path.dirname(input.batchFile), { recursive: true });
  writeBatch(input.batchFile, step, input.seqLen, rows, counts);
  return { counts, advantages: result.metrics, distill };
}

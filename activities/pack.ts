/**
 * `packBatch` (cpu queue): step n's rollouts become trainer input. Errored rollouts are dropped,
 * groups filtered by difficulty, advantages computed per group, samples packed first-fit-decreasing
 * into rows of seq_len, written as `batches/step_n.safetensors`. Idempotent by (run, step).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { computeAdvantages, type AdvantageMetrics } from '../lib/orchestrator/advantages';
import { readBatch, writeBatch } from '../lib/orchestrator/batch';
import { buildSample, packSamples, type PackCounts, type Sample } from '../lib/orchestrator/packing';
import { readRunConfig } from '../lib/run/config';
import { RunLayout } from '../lib/run/layout';
import { readRollouts, type StoredRollout } from './rollouts';

export interface PackInput {
  runDir: string;
  step: number;
}

export interface PackSummary {
  step: number;
  path: string;
  counts: PackCounts;
  advantages: AdvantageMetrics;
}

export function createPackActivities() {
  return {
    async packBatch({ runDir, step }: PackInput): Promise<PackSummary> {
      const layout = new RunLayout(runDir);
      const file = layout.batchFile(step);
      const config = readRunConfig(runDir);
      const rollouts = readRollouts(layout.rolloutsDir(step));
      const byGroup = new Map<number, StoredRollout[]>();
      for (const r of rollouts) byGroup.set(r.group, [...(byGroup.get(r.group) ?? []), r]);
      const groups = [...byGroup.keys()].sort((a, b) => a - b).map((g) => byGroup.get(g)!);
      const result = computeAdvantages(
        groups.map((g) => g.map((r) => ({ reward: r.reward, completionTokens: r.completionTokens, errored: r.error !== undefined }))),
        { advantage: config.orchestrator.advantage, filter: config.orchestrator.filter },
      );
      if (fs.existsSync(file)) {
        // Written by an earlier attempt: the rollouts determine it, so the stored one is this step's batch.
        return { step, path: file, counts: readBatch(file).counts, advantages: result.metrics };
      }
      const samples: Sample[] = [];
      groups.forEach((g, gi) =>
        g.forEach((r, ri) => {
          const advantage = result.advantages[gi][ri];
          if (advantage !== null) samples.push(buildSample(r.segments, advantage));
        }),
      );
      const { rows, counts } = packSamples(samples, config.orchestrator.seq_len);
      fs.mkdirSync(path.dirname(file), { recursive: true });
      writeBatch(file, step, config.orchestrator.seq_len, rows, counts);
      return { step, path: file, counts, advantages: result.metrics };
    },
  };
}

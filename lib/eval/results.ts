/**
 * Eval results on disk: one JSON file per model version, `<runDir>/eval/<model>.json`, holding the
 * metrics of every environment evaluated on it. `prime-rl eval` writes base / step_N files into its
 * run folder; an RL run's periodic evals write into the RL run folder, where the report finds them.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { z } from 'zod';
import { writeFileAtomic } from '../atomic';
import type { EnvEvalMetrics } from './metrics';
import { readJsonFile } from '../json';

export interface EvalResults {
  /** Model version: `base`, `step_10`, or an external API's model name. */
  model: string;
  /** Policy step of the weights; null for the base model or an external API. */
  step: number | null;
  /** Metrics by environment id. */
  environments: Record<string, EnvEvalMetrics>;
}

const metricsSchema = z.strictObject({
  num_examples: z.number().int().positive(),
  rollouts_per_example: z.number().int().positive(),
  avg_at_k: z.number(),
  reward_std: z.number(),
  pass_at_k: z.record(z.string(), z.number()).nullable(),
  completion_tokens_mean: z.number(),
});

const resultsSchema = z.strictObject({
  model: z.string().min(1),
  step: z.number().int().nonnegative().nullable(),
  environments: z.record(z.string(), metricsSchema),
});

export function evalDir(runDir: string): string {
  return path.join(runDir, 'eval');
}

/** The file of a model version; characters unfit for a file name (e.g. `/` in `org/model`) become `_`. */
export function evalResultsFile(runDir: string, model: string): string {
  return path.join(evalDir(runDir), `${model.replace(/[^A-Za-z0-9._-]/g, '_')}.json`);
}

export function writeEvalResults(runDir: string, results: EvalResults): string {
  const file = evalResultsFile(runDir, results.model);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  writeFileAtomic(file, JSON.stringify(results, null, 2) + '\n');
  return file;
}

/** Every results file of a run, base / external first, then by step; [] when there are none. */
export function readEvalResults(runDir: string): EvalResults[] {
  const dir = evalDir(runDir);
  if (!fs.existsSync(dir)) return [];
  const results = fs
    .readdirSync(dir)
    .filter((name) => name.endsWith('.json'))
    .map((name) => {
      const file = path.join(dir, name);
      const json = readJsonFile(file);
      const parsed = resultsSchema.safeParse(json);
      if (!parsed.success)
        throw new Error(
          `${file}: not an eval results file: ${parsed.error.issues.map((i) => `${i.path.join('.') || '(file)'}: ${i.message}`).join('; ')}`,
        );
      return parsed.data;
    });
  return results.sort((a, b) => (a.step ?? -1) - (b.step ?? -1) || a.model.localeCompare(b.model));
}

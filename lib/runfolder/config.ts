/**
 * The resolved config a run was started with, as stored in its run folder (`configs/rl.json` or
 * `configs/sft.json`), and an SFT run's plan (`sft/plan.json`).
 */
import * as fs from 'node:fs';
import { storedResult } from '../atomic';
import { Failure, NonRetryableError } from '../failures';
import type { z } from 'zod';
import { rlSchema, sftSchema, type RLConfig, type SFTConfig } from '../config/schemas';
import { RunLayout } from './layout';

/** `key: problem; key: problem`, as the CLI words them. */
function describeIssues(error: z.ZodError): string {
  return error.issues.map((i) => `${i.path.join('.') || '(config)'}: ${i.message}`).join('; ');
}

/**
 * A run's config checked as the CLI checks it: a workflow may be started without the CLI
 * (`temporal workflow start --input-file`), and a config that cannot train must fail at once.
 */
export function checkConfig<S extends z.ZodType>(config: unknown, schema: S): z.output<S> {
  const parsed = schema.safeParse(config);
  if (!parsed.success)
    throw new NonRetryableError(`invalid configuration: ${describeIssues(parsed.error)}`, Failure.InvalidConfig);
  return parsed.data;
}

/**
 * The text of the config a run folder stores and compares a new start's config with:
 * ckpt.resume_step says where one start begins (lib/run-ops/rewind.ts), not what the run is.
 */
export function storedConfigText(config: RLConfig | SFTConfig): string {
  return `${JSON.stringify({ ...config, ckpt: { ...config.ckpt, resume_step: undefined } }, null, 2)}\n`;
}

const cache = new Map<string, { mtimeMs: number; config: unknown }>();

function readStored<S extends z.ZodType>(file: string, schema: S): z.output<S> {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(file);
  } catch {
    throw new NonRetryableError(`run config ${file} does not exist: was the run prepared?`, Failure.MissingRunConfig);
  }
  const hit = cache.get(file);
  if (hit && hit.mtimeMs === stat.mtimeMs) return hit.config as z.output<S>;
  const parsed = schema.safeParse(JSON.parse(fs.readFileSync(file, 'utf8')));
  if (!parsed.success)
    throw new NonRetryableError(
      `run config ${file} is invalid: ${describeIssues(parsed.error)}`,
      Failure.InvalidRunConfig,
    );
  cache.set(file, { mtimeMs: stat.mtimeMs, config: parsed.data });
  return parsed.data;
}

/** Reads `<runDir>/configs/rl.json`; a missing or invalid file is a non-retryable failure. */
export function readRunConfig(runDir: string): RLConfig {
  return readStored(new RunLayout(runDir).configFile, rlSchema);
}

/** Reads `<runDir>/configs/sft.json` (written by prepareSft). */
export function readSftConfig(runDir: string): SFTConfig {
  return readStored(new RunLayout(runDir).sftConfigFile, sftSchema);
}

/** What prepareSft laid out: the step batches and validation batches in `batches/`. */
export interface SftPlan {
  runDir: string;
  /** Optimizer steps (batches/step_0 .. step_{steps-1}). */
  steps: number;
  /** Validation batches (batches/val_0 ..); 0 = no validation. */
  valBatches: number;
  samples: number;
  valSamples: number;
}

/** The plan of a prepared SFT run, or undefined before prepareSft finished. */
export function readSftPlan(runDir: string): SftPlan | undefined {
  return storedResult<SftPlan>(new RunLayout(runDir).sftPlanFile);
}

/** The validation batch files of a prepared SFT run (none before prepareSft finished, or without validation). */
export function validationBatchFiles(runDir: string): string[] {
  const layout = new RunLayout(runDir);
  return Array.from({ length: readSftPlan(runDir)?.valBatches ?? 0 }, (_, i) => layout.valBatchFile(i));
}

/** A run folder's kinds of run, by the config file each keeps. */
const RUN_CONFIG_FILES = {
  rl: (layout: RunLayout) => layout.configFile,
  sft: (layout: RunLayout) => layout.sftConfigFile,
} as const;

/**
 * Whether the run folder of `layout` already holds this `kind` of run with config `text` (false: no
 * run yet). A run of the other kind, or another config, there is a ConfigMismatch: the folder holds
 * another run (checked before a run starts: one run, of one kind, per folder).
 */
export function holdsRunConfig(layout: RunLayout, kind: keyof typeof RUN_CONFIG_FILES, text: string): boolean {
  for (const [other, fileOf] of Object.entries(RUN_CONFIG_FILES))
    if (other !== kind && fs.existsSync(fileOf(layout)))
      throw new NonRetryableError(
        `run folder ${layout.dir} holds an ${other.toUpperCase()} run (${fileOf(layout)}); use another run_name or output_dir`,
        Failure.ConfigMismatch,
      );
  const file = RUN_CONFIG_FILES[kind](layout);
  if (!fs.existsSync(file)) return false;
  if (fs.readFileSync(file, 'utf8') === text) return true;
  throw new NonRetryableError(
    `run folder ${layout.dir} holds a run with a different config (${file}); use another run_name or output_dir`,
    Failure.ConfigMismatch,
  );
}

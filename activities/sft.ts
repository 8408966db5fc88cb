/**
 * SFT bookkeeping on the cpu queue. `prepareSft` turns the dataset into the run's trainer input
 * up front (lib/sft/prepare.ts): every optimizer step's packed batch and the validation batches,
 * then the plan (`sft/plan.json`, its done-marker). The trainer then replays and resumes an SFT
 * run exactly as an RL run. `recordSftStep` appends a step's metrics line (once, whatever the retries).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { sftSchema, type SFTConfig } from '../lib/config/schemas';
import { Failure } from '../lib/failures';
import { resolveHubName } from '../lib/hub';
import { checkConfig, holdsRunConfig, readSftPlan, storedConfigText, type SftPlan } from '../lib/runfolder/config';
import { RunLayout } from '../lib/runfolder/layout';
import { appendStepMetrics } from '../lib/runfolder/metrics';
import type { EvalResults } from '../lib/eval/results';
import type { SftDataSource } from '../lib/sft';
import type { SftPrepareInput, SftPrepareResult } from '../lib/sft/prepare';
import { libModule } from '../lib/thread';
import { inThreadWithHeartbeat } from '../lib/temporal/heartbeat';
import { checkModel } from '../lib/preflight';
import type { TrainSummary } from './types';

/** Validation examples drawn from data.env's eval split when val.num_examples is unset. */
const DEFAULT_ENV_VAL_EXAMPLES = 64;

/**
 * A Hugging Face dataset name (or a folder laid out as on the Hub): its folder, or its subset's
 * (a configuration: the folder of the dataset it names). InvalidConfig when found nowhere.
 */
function hubDataset(name: string, split: string, key: string, subset?: string): SftDataSource['dataset'] {
  let dir: string;
  try {
    dir = resolveHubName(name, 'dataset', key);
  } catch (e) {
    throw ApplicationFailure.nonRetryable((e as Error).message, Failure.InvalidConfig);
  }
  if (subset === undefined) return { dir, name, split };
  const sub = path.join(dir, subset);
  if (!fs.existsSync(sub) || !fs.statSync(sub).isDirectory()) {
    const subsets = fs
      .readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isDirectory() && !e.name.startsWith('.'));
    throw ApplicationFailure.nonRetryable(
      `${key.replace(/\.name$/, '.subset')}: dataset ${name} has no subset '${subset}' (no folder ${sub}; its folders: ${subsets.map((e) => e.name).join(', ') || 'none'})`,
      Failure.InvalidConfig,
    );
  }
  return { dir: sub, name: `${name} (${subset})`, split };
}

/** The training data: data.path, data.name or data.env, or each of [[data.source]]. */
function trainSources(c: SFTConfig): SftDataSource[] {
  const d = c.data;
  if (d.source.length === 0)
    return [
      {
        path: d.path === undefined ? undefined : path.resolve(d.path),
        dataset: d.name === undefined ? undefined : hubDataset(d.name, d.split, 'data.name'),
        env: d.env,
        numExamples: d.num_examples,
      },
    ];
  return d.source.map((src, i) => ({
    path: src.path === undefined ? undefined : path.resolve(src.path),
    dataset: src.name === undefined ? undefined : hubDataset(src.name, src.split, `data.source[${i}].name`, src.subset),
    env: src.env,
    numExamples: src.num_examples,
    ratio: src.ratio,
    ...(src.renderer?.chat_template !== undefined ? { chatTemplate: path.resolve(src.renderer.chat_template) } : {}),
  }));
}

function validationSource(c: SFTConfig): SftDataSource | undefined {
  if (c.val.interval === undefined) return undefined;
  if (c.val.path !== undefined) return { path: path.resolve(c.val.path), numExamples: c.val.num_examples };
  if (c.val.name !== undefined)
    return { dataset: hubDataset(c.val.name, c.val.split, 'val.name'), numExamples: c.val.num_examples };
  if (c.data.env !== undefined) return { env: c.data.env, numExamples: c.val.num_examples ?? DEFAULT_ENV_VAL_EXAMPLES };
  throw ApplicationFailure.nonRetryable(
    'val.interval is set but there is no validation data: set val.path or val.name, or use data.env (its eval split)',
    Failure.InvalidConfig,
  );
}

/**
 * Checks the config, writes configs/sft.json and every batch (lib/sft/prepare.ts, in a worker
 * thread: tokenising a dataset is CPU-bound); a rerun with the same config returns the stored plan.
 */
export async function prepareSft(config: SFTConfig): Promise<SftPlan> {
  checkConfig(config, sftSchema);
  const layout = RunLayout.of(config.output_dir, config.run_name);
  const text = storedConfigText(config);
  if (holdsRunConfig(layout, 'sft', text)) {
    const done = readSftPlan(layout.dir);
    if (done) return done;
  }
  const modelDir = checkModel(config.model.name);
  const d = config.data;
  const input: SftPrepareInput = {
    runDir: layout.dir,
    modelDir,
    configText: text,
    train: trainSources(config),
    val: validationSource(config),
    lossRoles: d.loss_roles,
    seed: config.seed,
    batchSize: config.batch_size,
    epochs: config.epochs,
    maxSteps: config.max_steps,
    seqLen: config.seq_len,
  };
  const result = await inThreadWithHeartbeat<SftPrepareResult>(libModule('sft/prepare'), 'prepareSftData', input, {
    phase: 'starting',
  });
  if (result.ok) return result.plan;
  // Bad data (a malformed row, a template without the prefix property) or a seq_len that leaves a
  // batch nothing to train: retrying cannot fix either.
  if (result.problem === 'seq_len')
    throw ApplicationFailure.nonRetryable(`seq_len: ${result.message}`, Failure.InvalidConfig);
  throw ApplicationFailure.nonRetryable(
    `${result.problem === 'data' ? 'SFT data' : 'SFT validation data'}: ${result.message}`,
    Failure.InvalidSftData,
  );
}

export interface SftStepRecordInput {
  runDir: string;
  step: number;
  train: TrainSummary;
  /** Validation loss after this step, when it was measured. */
  valLoss?: number;
  /** Unix seconds around the train step, as the workflow saw them. */
  time: { train_start: number; train_end: number };
  /** The environments' evals of the weights after this step, when they ran (eval.interval). */
  evals?: EvalResults[];
}

/** `eval/<env>/avg@k` (and pass@1 where rewards are binary) of each environment evaluated. */
function evalMetrics(evals: readonly EvalResults[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const r of evals)
    for (const [env, m] of Object.entries(r.environments)) {
      out[`eval/${env}/avg@${m.rollouts_per_example}`] = m.avg_at_k;
      if (m.pass_at_k?.['1'] !== undefined) out[`eval/${env}/pass@1`] = m.pass_at_k['1'];
    }
  return out;
}

/** One metrics.jsonl line per SFT step. */
export async function recordSftStep({ runDir, step, train, valLoss, time, evals }: SftStepRecordInput): Promise<void> {
  const m = train.metrics;
  appendStepMetrics(new RunLayout(runDir).metricsFile, {
    step,
    loss: m.loss,
    val_loss: valLoss ?? null,
    lr: m.lr,
    grad_norm: m.grad_norm,
    tokens: m.tokens,
    loss_tokens: m.loss_tokens,
    tokens_per_s: m.tokens_per_s,
    ...(m.expert_load_mean === undefined
      ? {}
      : {
          router_aux_loss: m.router_aux_loss,
          expert_load_max: m.expert_load_max,
          expert_load_mean: m.expert_load_mean,
        }),
    ...(evals ? evalMetrics(evals) : {}),
    progress: train.progress,
    time,
  });
}

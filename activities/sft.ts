/**
 * SFT bookkeeping on the cpu queue. `prepareSft` turns the dataset into the run's trainer input
 * up front: every optimizer step's packed batch (`batches/step_k.safetensors`, cross-entropy, so
 * advantages and logprobs are zeros) and the validation batches (`batches/val_i`), then the plan
 * (`sft/plan.json`, its done-marker). The trainer then replays and resumes an SFT run exactly as an
 * RL run. `recordSftStep` appends a step's metrics line (once, whatever the retries).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import { writeFileAtomic } from '../lib/atomic';
import type { SFTConfig } from '../lib/config/schemas';
import { readHfConfig } from '../lib/model/hf';
import { Tokenizer } from '../lib/model/tokenizer';
import { writeBatch } from '../lib/orchestrator/batch';
import { packSamples, type Sample } from '../lib/orchestrator/packing';
import { readSftPlan, type SftPlan } from '../lib/run/config';
import { RunLayout } from '../lib/run/layout';
import { appendStepMetrics } from '../lib/run/metrics';
import { loadSftDataset, SftSchedule, type SftDataSource } from '../lib/sft';
import type { TrainSummary } from './types';

/** Validation examples drawn from data.env's eval split when val.num_examples is unset. */
const DEFAULT_ENV_VAL_EXAMPLES = 64;

const yieldToLoop = () => new Promise((r) => setImmediate(r));

/** Bad data (a malformed row, a template without the prefix property) cannot be retried away. */
function dataset(tokenizer: Tokenizer, source: SftDataSource, split: 'train' | 'eval', c: SFTConfig, what: string): Sample[] {
  try {
    return loadSftDataset(tokenizer, source, split, { lossRoles: c.data.loss_roles, seed: c.seed }).samples;
  } catch (e) {
    throw ApplicationFailure.nonRetryable(`${what}: ${(e as Error).message}`, Failure.InvalidSftData);
  }
}

function validationSource(c: SFTConfig): SftDataSource | undefined {
  if (c.val.interval === undefined) return undefined;
  if (c.val.path !== undefined) return { path: path.resolve(c.val.path), numExamples: c.val.num_examples };
  if (c.data.env !== undefined) return { env: c.data.env, numExamples: c.val.num_examples ?? DEFAULT_ENV_VAL_EXAMPLES };
  throw ApplicationFailure.nonRetryable('val.interval is set but there is no validation data: set val.path, or use data.env (its eval split)', Failure.InvalidConfig);
}

/** Checks the config, writes configs/sft.json and every batch; a rerun with the same config returns the stored plan. */
export async function prepareSft(config: SFTConfig): Promise<SftPlan> {
  const layout = RunLayout.of(config.output_dir, config.run_name);
  const text = `${JSON.stringify(config, null, 2)}\n`;
  if (fs.existsSync(layout.configFile)) {
    throw ApplicationFailure.nonRetryable(`run folder ${layout.dir} holds an RL run; use another run_name or output_dir`, Failure.ConfigMismatch);
  }
  if (fs.existsSync(layout.sftConfigFile)) {
    if (fs.readFileSync(layout.sftConfigFile, 'utf8') !== text) {
      throw ApplicationFailure.nonRetryable(
        `run folder ${layout.dir} holds a run with a different config (${layout.sftConfigFile}); use another run_name or output_dir`,
        Failure.ConfigMismatch,
      );
    }
    const done = readSftPlan(layout.dir);
    if (done) return done;
  }
  const modelDir = path.resolve(config.model.name);
  try {
    readHfConfig(modelDir);
  } catch (e) {
    throw ApplicationFailure.nonRetryable(`model.name: ${(e as Error).message}`, Failure.InvalidModel);
  }
  const tokenizer = Tokenizer.fromDir(modelDir);
  const d = config.data;
  const train = dataset(tokenizer, { path: d.path === undefined ? undefined : path.resolve(d.path), env: d.env, numExamples: d.num_examples }, 'train', config, 'SFT data');
  const valSource = validationSource(config);
  const val = valSource ? dataset(tokenizer, valSource, 'eval', config, 'SFT validation data') : [];

  fs.mkdirSync(path.dirname(layout.sftConfigFile), { recursive: true });
  writeFileAtomic(layout.sftConfigFile, text);
  fs.mkdirSync(path.dirname(layout.batchFile(0)), { recursive: true });

  const schedule = new SftSchedule({ datasetSize: train.length, batchSize: config.batch_size, epochs: config.epochs, maxSteps: config.max_steps, seed: config.seed });
  const ctx = Context.current();
  for (let step = 0; step < schedule.totalSteps; step++) {
    const { rows, counts } = packSamples(schedule.batch(step).indices.map((i) => train[i]), config.seq_len, { padTokenId: tokenizer.padTokenId });
    writeBatch(layout.batchFile(step), step, config.seq_len, rows, counts);
    ctx.heartbeat({ step, steps: schedule.totalSteps });
    await yieldToLoop();
  }
  let valBatches = 0;
  for (let from = 0; from < val.length; from += config.batch_size) {
    const { rows, counts } = packSamples(val.slice(from, from + config.batch_size), config.seq_len, { padTokenId: tokenizer.padTokenId });
    writeBatch(layout.valBatchFile(valBatches), valBatches, config.seq_len, rows, counts);
    valBatches++;
  }
  const plan: SftPlan = { runDir: layout.dir, steps: schedule.totalSteps, valBatches, samples: train.length, valSamples: val.length };
  fs.mkdirSync(path.dirname(layout.sftPlanFile), { recursive: true });
  writeFileAtomic(layout.sftPlanFile, `${JSON.stringify(plan, null, 1)}\n`);
  return plan;
}

export interface SftStepRecordInput {
  runDir: string;
  step: number;
  train: TrainSummary;
  /** Validation loss after this step, when it was measured. */
  valLoss?: number;
  /** Unix seconds around the train step, as the workflow saw them. */
  time: { train_start: number; train_end: number };
}

/** One metrics.jsonl line per SFT step. */
export async function recordSftStep({ runDir, step, train, valLoss, time }: SftStepRecordInput): Promise<void> {
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
    progress: train.progress,
    time,
  });
}

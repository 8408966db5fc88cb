/**
 * An SFT run's trainer input, prepared up front: the dataset tokenised, every optimizer step's
 * packed batch (`batches/step_k.safetensors`: cross-entropy, so advantages and logprobs are
 * zeros), the validation batches (`batches/val_i`), then the plan (`sft/plan.json`, the done-marker).
 * CPU-bound (the whole dataset goes through the chat template and tokenizer), so `prepareSft` runs
 * it in a worker thread (lib/thread.ts) and heartbeats from the progress it reports.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { writeFileAtomic } from '../atomic';
import { Tokenizer } from '../model/tokenizer';
import { writeBatch } from '../runfolder/batch';
import { packSamples, type PackCounts, type Sample } from '../runfolder/packing';
import type { SftPlan } from '../runfolder/config';
import { RunLayout } from '../runfolder/layout';
import { loadSftDataset, type SftDataSource } from './data';
import { SftMixSchedule, SftSchedule } from './schedule';

export interface SftPrepareInput {
  runDir: string;
  modelDir: string;
  /** The resolved config (configs/sft.json), written once the data has loaded. */
  configText: string;
  /** The training data: one source, or several mixed by their ratios (lib/sft/schedule.ts SftMixSchedule). */
  train: SftDataSource[];
  /** Validation data; none = no validation batches. */
  val?: SftDataSource;
  lossRoles: string[];
  seed: number;
  batchSize: number;
  epochs: number;
  maxSteps?: number;
  seqLen: number;
}

/** Heartbeat details of `prepareSft`. */
export type SftPrepareProgress =
  | { phase: 'tokenizing' | 'tokenizing validation'; done: number; total: number }
  | { phase: 'packing'; step: number; steps: number };

/**
 * The plan, or why the data cannot make one: `data` (a bad row or dataset, named), or `seq_len`
 * (a batch in which no token carries loss once its samples are cut to seq_len).
 */
export type SftPrepareResult =
  { ok: true; plan: SftPlan } | { ok: false; problem: 'data' | 'validation data' | 'seq_len'; message: string };

/** Posting every conversation's progress would flood the parent thread; this many per post. */
const PROGRESS_EVERY = 64;

function noLossTokens(what: string, counts: PackCounts, seqLen: number): string {
  return (
    `${what} has no token that carries loss: seq_len (${seqLen}) cuts each of its ${counts.samples} samples before its first loss token ` +
    `(${counts.truncated} samples cut, ${counts.truncatedTokens} tokens cut off); raise seq_len`
  );
}

export async function prepareSftData(
  input: SftPrepareInput,
  progress: (p: SftPrepareProgress) => void = () => {},
): Promise<SftPrepareResult> {
  const layout = new RunLayout(input.runDir);
  const tokenizer = Tokenizer.fromDir(input.modelDir);
  const load = (
    source: SftDataSource,
    split: 'train' | 'eval',
    phase: 'tokenizing' | 'tokenizing validation',
  ): Promise<Sample[]> =>
    loadSftDataset(tokenizer, source, split, {
      lossRoles: input.lossRoles,
      seed: input.seed,
      onProgress: (done, total) => {
        if (done % PROGRESS_EVERY === 0 || done === total) progress({ phase, done, total });
      },
    }).then((d) => d.samples);
  const train: Sample[][] = [];
  let val: Sample[] = [];
  for (const source of input.train) {
    try {
      train.push(await load(source, 'train', 'tokenizing'));
    } catch (e) {
      const which = input.train.length > 1 ? `data.source[${train.length}]: ` : '';
      return { ok: false, problem: 'data', message: `${which}${(e as Error).message}` };
    }
  }
  try {
    if (input.val) val = await load(input.val, 'eval', 'tokenizing validation');
  } catch (e) {
    return { ok: false, problem: 'validation data', message: (e as Error).message };
  }

  fs.mkdirSync(path.dirname(layout.sftConfigFile), { recursive: true });
  writeFileAtomic(layout.sftConfigFile, input.configText);
  fs.mkdirSync(path.dirname(layout.batchFile(0)), { recursive: true });

  const { seqLen, batchSize } = input;
  const pack = { padTokenId: tokenizer.padTokenId };
  // One dataset: its epochs' shuffles; several: each its share of every batch.
  const schedule =
    train.length === 1
      ? new SftSchedule({
          datasetSize: train[0].length,
          batchSize,
          epochs: input.epochs,
          maxSteps: input.maxSteps,
          seed: input.seed,
        })
      : new SftMixSchedule({
          sources: train.map((s, i) => ({ size: s.length, ratio: input.train[i].ratio ?? 1 })),
          batchSize,
          epochs: input.epochs,
          maxSteps: input.maxSteps,
          seed: input.seed,
        });
  const batchOf = (step: number): Sample[] =>
    schedule instanceof SftSchedule
      ? schedule.batch(step).indices.map((i) => train[0][i])
      : schedule.batch(step).map(({ source, index }) => train[source][index]);
  for (let step = 0; step < schedule.totalSteps; step++) {
    const { rows, counts } = packSamples(batchOf(step), seqLen, pack);
    // A step that would train on nothing is the config's fault; say so before the run starts.
    if (counts.lossTokens === 0)
      return { ok: false, problem: 'seq_len', message: noLossTokens(`the batch of step ${step}`, counts, seqLen) };
    writeBatch(layout.batchFile(step), step, seqLen, rows, counts);
    progress({ phase: 'packing', step, steps: schedule.totalSteps });
  }
  let valBatches = 0;
  for (let from = 0; from < val.length; from += batchSize) {
    const { rows, counts } = packSamples(val.slice(from, from + batchSize), seqLen, pack);
    if (counts.lossTokens === 0)
      return { ok: false, problem: 'seq_len', message: noLossTokens(`validation batch ${valBatches}`, counts, seqLen) };
    writeBatch(layout.valBatchFile(valBatches), valBatches, seqLen, rows, counts);
    valBatches++;
  }
  const plan: SftPlan = {
    runDir: layout.dir,
    steps: schedule.totalSteps,
    valBatches,
    samples: train.reduce((n, s) => n + s.length, 0),
    valSamples: val.length,
  };
  fs.mkdirSync(path.dirname(layout.sftPlanFile), { recursive: true });
  writeFileAtomic(layout.sftPlanFile, `${JSON.stringify(plan, null, 1)}\n`);
  return { ok: true, plan };
}

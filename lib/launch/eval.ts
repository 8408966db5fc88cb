/** `prime-rl eval`: a cpu worker, the inference server unless an external API is evaluated, the `eval` workflow. */
import * as path from 'node:path';
import { inferenceSchema, type EvalConfig } from '../config/schemas';
import { ConfigError } from '../failures';
import { renderEvalTable } from '../eval';
import type { EvalResults } from '../eval/results';
import { RunLayout } from '../runfolder/layout';
import { follow } from './follow';
import { launch, type LaunchOptions, type LocalRun } from './launch';

/**
 * What the launcher reads of the `eval` workflow's result (workflows/eval.ts `EvalResult`;
 * test/launcher.test.ts checks that it fits).
 */
export interface EvalResultView {
  runDir: string;
  results: EvalResults[];
}

/** An eval: a cpu worker, plus an inference server on model.name unless an external API is evaluated. */
export function launchEval(config: EvalConfig, opts: LaunchOptions = {}): Promise<LocalRun<EvalResultView>> {
  const local = config.client.base_url === undefined;
  if (local && !config.model.name)
    throw new ConfigError('model.name: the model folder to evaluate (or client.base_url for an external API)');
  const inference = local
    ? inferenceSchema.parse({
        model: { name: config.model.name, dtype: config.model.dtype, device: config.model.device },
        seq_len: config.seq_len,
        output_dir: config.output_dir,
        seed: config.seed,
        threads: config.threads,
        server: config.server,
        allowed_weight_roots: [config.output_dir, ...(config.weights_dir !== undefined ? [config.weights_dir] : [])],
      })
    : undefined;
  return launch<EvalResultView>(
    {
      runName: config.run_name,
      outputDir: config.output_dir,
      temporal: config.temporal,
      inference,
      pools: ['cpu'],
      worker: { env_workers: 2, env_timeout_s: 60, threads: config.threads },
      workflowType: 'eval',
      args: [{ config }],
      memo: {
        runDir: path.resolve(RunLayout.of(config.output_dir, config.run_name).dir),
        model: config.model.name ?? '',
      },
    },
    opts,
  );
}

/** The `eval` command: the results table, and where the files are. */
export async function runEval(config: EvalConfig, opts: LaunchOptions = {}): Promise<void> {
  const run = await launchEval(config, opts);
  await follow(run, config.run_name, (result) => {
    process.stdout.write(`${renderEvalTable(result.results)}\n  results: ${path.join(result.runDir, 'eval')}\n`);
  });
}

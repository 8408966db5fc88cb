/**
 * Checks activities run before they start work, each failing the run non-retryably with the type
 * that names its cause (lib/failures.ts): the model folder, the environments, and a run folder
 * that already holds another run.
 */
import * as fs from 'node:fs';
import { ApplicationFailure } from '@temporalio/common';
import type { EnvSpec } from '../lib/envs/loader';
import { loadEnvironment } from '../lib/envs/loader';
import type { EnvPool } from '../lib/envs/pool';
import type { EnvironmentInfo } from '../lib/envs/types';
import { Failure } from '../lib/failures';
import { resolveModelDir } from '../lib/hub';
import { readHfConfig } from '../lib/model/hf';
import type { RunLayout } from '../lib/run/layout';

/** The model folder `name` (a folder or a Hugging Face name; config key `key`) stands for, when it holds a loadable model (InvalidModel otherwise). */
export function checkModel(name: string, key = 'model.name'): string {
  let resolved: string;
  try {
    resolved = resolveModelDir(name, key);
    readHfConfig(resolved);
  } catch (e) {
    throw ApplicationFailure.nonRetryable(`${key}: ${(e as Error).message}`, Failure.InvalidModel);
  }
  return resolved;
}

/** Loads each environment in this process (InvalidEnvironment for the first that fails). */
export function checkEnvironments(envs: readonly EnvSpec[]): void {
  for (const e of envs) {
    try {
      loadEnvironment(e.id, e.args);
    } catch (err) {
      throw ApplicationFailure.nonRetryable((err as Error).message, Failure.InvalidEnvironment);
    }
  }
}

/** An environment's info from the env worker pool (InvalidEnvironment when it cannot be loaded there). */
export async function environmentInfo(pool: EnvPool, env: EnvSpec): Promise<EnvironmentInfo> {
  const r = await pool.info(env);
  if (!r.ok)
    throw ApplicationFailure.nonRetryable(
      `environment '${env.id}' cannot be loaded: ${r.error}`,
      Failure.InvalidEnvironment,
    );
  return r.value;
}

/** A run folder's kinds of run, by the config file each keeps (lib/run/layout.ts). */
const RUN_CONFIG_FILES = {
  rl: (layout: RunLayout) => layout.configFile,
  sft: (layout: RunLayout) => layout.sftConfigFile,
} as const;

/**
 * Whether the run folder of `layout` already holds this `kind` of run with config `text` (false: no
 * run yet). A run of the other kind, or another config, there is a ConfigMismatch: the folder holds
 * another run.
 */
export function holdsRunConfig(layout: RunLayout, kind: keyof typeof RUN_CONFIG_FILES, text: string): boolean {
  for (const [other, fileOf] of Object.entries(RUN_CONFIG_FILES))
    if (other !== kind && fs.existsSync(fileOf(layout)))
      throw ApplicationFailure.nonRetryable(
        `run folder ${layout.dir} holds an ${other.toUpperCase()} run (${fileOf(layout)}); use another run_name or output_dir`,
        Failure.ConfigMismatch,
      );
  const file = RUN_CONFIG_FILES[kind](layout);
  if (!fs.existsSync(file)) return false;
  if (fs.readFileSync(file, 'utf8') === text) return true;
  throw ApplicationFailure.nonRetryable(
    `run folder ${layout.dir} holds a run with a different config (${file}); use another run_name or output_dir`,
    Failure.ConfigMismatch,
  );
}

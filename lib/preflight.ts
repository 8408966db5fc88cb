/**
 * Checks activities run before they start work, each failing the run non-retryably with the type
 * that names its cause (lib/failures.ts): the model folder and the environments. (A run folder that
 * already holds another run: `holdsRunConfig`, lib/runfolder/config.ts.)
 */
import type { EnvSpec } from './envs/loader';
import { loadEnvironment } from './envs/loader';
import type { EnvPool } from './envs/pool';
import type { EnvironmentInfo } from './envs/types';
import { Failure, NonRetryableError } from './failures';
import { resolveModelDir } from './hub';
import { readHfConfig, readHfConfigShape } from './model/hf';

/**
 * The model folder `name` (a folder or a Hugging Face name; config key `key`) stands for, when it
 * holds a loadable model (InvalidModel otherwise). `weights: false` for a model another process
 * serves (a distillation teacher): its folder here needs only its config and tokenizer.
 */
export function checkModel(name: string, key = 'model.name', { weights = true } = {}): string {
  let resolved: string;
  try {
    resolved = resolveModelDir(name, key);
    (weights ? readHfConfig : readHfConfigShape)(resolved);
  } catch (e) {
    throw new NonRetryableError(`${key}: ${(e as Error).message}`, Failure.InvalidModel);
  }
  return resolved;
}

/** Loads each environment in this process (InvalidEnvironment for the first that fails). */
export function checkEnvironments(envs: readonly EnvSpec[]): void {
  for (const e of envs) {
    try {
      loadEnvironment(e.id, e.args);
    } catch (err) {
      throw new NonRetryableError((err as Error).message, Failure.InvalidEnvironment);
    }
  }
}

/** An environment's info from the env worker pool (InvalidEnvironment when it cannot be loaded there). */
export async function environmentInfo(pool: EnvPool, env: EnvSpec): Promise<EnvironmentInfo> {
  const r = await pool.info(env);
  if (!r.ok)
    throw new NonRetryableError(`environment '${env.id}' cannot be loaded: ${r.error}`, Failure.InvalidEnvironment);
  return r.value;
}

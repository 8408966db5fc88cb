/** The tasks the env pool (parent) hands its worker processes (lib/helper-pool.ts carries them). */
import type { EnvSpec } from './loader';
import type { Example, JsonObject, ScoreContext, Split, TurnContext } from './types';

export type EnvCall =
  | { op: 'info' }
  | { op: 'example'; split: Split; index: number; seed: number }
  | { op: 'init'; example: Example }
  | { op: 'respond'; ctx: TurnContext<JsonObject> }
  | { op: 'score'; ctx: ScoreContext<JsonObject> };

export interface EnvTask {
  env: EnvSpec;
  call: EnvCall;
}

/** Messages between the env pool (parent) and its worker processes; JSON over the fork IPC channel. */
import type { EnvSpec } from './loader';
import type { Example, JsonObject, ScoreContext, Split, TurnContext } from './types';

export type EnvCall =
  | { op: 'info' }
  | { op: 'example'; split: Split; index: number; seed: number }
  | { op: 'init'; example: Example }
  | { op: 'respond'; ctx: TurnContext<JsonObject> }
  | { op: 'score'; ctx: ScoreContext<JsonObject> };

export interface PoolRequest {
  id: number;
  env: EnvSpec;
  call: EnvCall;
}

export type WorkerMessage =
  | { type: 'ready' }
  | { type: 'result'; id: number; ok: true; value: unknown }
  | { type: 'result'; id: number; ok: false; error: string; stack?: string };

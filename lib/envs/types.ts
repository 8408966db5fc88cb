/**
 * The environment API: what an environment provides (a dataset, a rollout protocol, a rubric) and
 * the plain-JSON values that cross between the rollout driver, the env worker pool and the env.
 *
 * Rollout protocol, as the driver runs it:
 *   1. `example = dataset.example(split, index, seed)`; the conversation starts as `example.prompt`.
 *   2. `state = init(example)`: env-owned JSON carried through the rollout.
 *   3. The model writes assistant turn t (t = 1, 2, ...). If t == maxTurns the rollout ends.
 *      Otherwise `respond({example, messages, state, turn: t})` returns messages to append
 *      (user feedback, `role: "tool"` results) and/or `done`, and the next state.
 *   4. `score({example, messages, completion, state})` applies the rubric.
 * Everything an env returns must be JSON-serialisable: calls run in child processes.
 */
import type { ChatMessage } from '../model/chat';

/** An OpenAI chat message (`role`, `content`, optional `name`, `tool_calls`, `tool_call_id`). */
export type Message = ChatMessage;

export type Split = 'train' | 'eval';

/** JSON object: the env's own data in examples and rollout state. */
export type JsonObject = Record<string, unknown>;

/** How a call to an environment (a pool worker, a verifiers env server) failed: it threw, ran past its timeout, or its process died. */
export type EnvFailureKind = 'error' | 'timeout' | 'crash';

/** `kind` as the verb of an error message: "failed", "timed out", "crashed". */
export function failedHow(kind: EnvFailureKind): string {
  return kind === 'error' ? 'failed' : kind === 'timeout' ? 'timed out' : 'crashed';
}

export interface Example {
  /** The opening messages, system prompt (if any) first. */
  prompt: Message[];
  /** Reference answer for the rubric ('' when the env has none). */
  answer: string;
  info: JsonObject;
}

export interface Dataset {
  /** Examples in a split; `undefined` for generated datasets, which have no end. */
  size(split: Split): number | undefined;
  /** Example `index` of `split` under `seed`: a pure function of the three. */
  example(split: Split, index: number, seed: number): Example;
}

/** An OpenAI-style function definition, passed to the chat template so the model sees the tools. */
export interface ToolSchema {
  type: 'function';
  function: { name: string; description: string; parameters: JsonObject };
}

export interface TurnContext<S extends JsonObject = JsonObject> {
  example: Example;
  /** The whole conversation so far: prompt, then every turn, ending with the model's latest turn. */
  messages: Message[];
  state: S;
  /** Assistant turns so far (>= 1). */
  turn: number;
}

export interface EnvResponse<S extends JsonObject = JsonObject> {
  /** Messages to append before the model's next turn (e.g. `user` feedback or `tool` results). */
  messages?: Message[];
  /** True ends the rollout; the model gets no further turn. */
  done: boolean;
  /** The next state; omitted = unchanged. */
  state?: S;
}

export interface ScoreContext<S extends JsonObject = JsonObject> {
  example: Example;
  /** The whole conversation: prompt + completion. */
  messages: Message[];
  /** Everything after the prompt: assistant turns and env responses. */
  completion: Message[];
  state: S;
}

/** One named term of the reward. Weight 0 makes a logged-only metric. */
export interface RewardFunction<S extends JsonObject = JsonObject> {
  name: string;
  /** Default 1. */
  weight?: number;
  fn(ctx: ScoreContext<S>): number | Promise<number>;
}

export type Rubric<S extends JsonObject = JsonObject> = RewardFunction<S>[];

export interface Score {
  /** Weighted sum of the rubric's functions. */
  reward: number;
  /** Each function's unweighted value, by name. */
  metrics: Record<string, number>;
}

/** What the driver needs to know about an environment before it runs rollouts. */
export interface EnvironmentInfo {
  name: string;
  maxTurns: number;
  tools: ToolSchema[];
  /** Examples per split; null for generated datasets (JSON has no undefined). */
  size: { train: number | null; eval: number | null };
}

/** A loaded environment: a definition's `create(args)` with every default filled in. */
export interface Environment<S extends JsonObject = JsonObject> {
  name: string;
  /** Assistant turns at most (1 = single-turn). */
  maxTurns: number;
  tools: ToolSchema[];
  dataset: Dataset;
  init(example: Example): S;
  respond(ctx: TurnContext<S>): EnvResponse<S> | Promise<EnvResponse<S>>;
  score(ctx: ScoreContext<S>): Promise<Score>;
  /** The reference assistant turn(s) that solve an example; envs without it cannot generate SFT data. */
  demonstration?(example: Example): Message[];
}

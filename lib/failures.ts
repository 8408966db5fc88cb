/**
 * The non-retryable failures of activities: one type per cause, raised with
 * `ApplicationFailure.nonRetryable(message, Failure.X)` in activities/ (lib/ throws
 * `NonRetryableError`, which activities/failures.ts converts) and read back by the CLI (`rl`, `sft`,
 * `eval` and `runs show`) from a failed workflow. A failure that retrying can fix (a worker or
 * server that is down, a full queue) is never one of these: Temporal retries it.
 *
 * Also the errors that end a CLI command with their message alone, before or without a workflow:
 * bad input (`ConfigError`, exit 2, as the bad-input failure types) and a command that could not do
 * what it was asked (`CommandError`, exit 1). Every layer may throw them: they sit at the bottom.
 *
 * No imports: the CLI loads this for every command, Temporal client or not.
 */

/** Errors in user input (config keys, values, files): the CLI prints them and exits with code 2. */
export class ConfigError extends Error {
  readonly exitCode = 2;
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

/** A Hugging Face name that is neither a folder nor in the hub cache (lib/hub.ts): bad input (exit 2). */
export class HubNameError extends ConfigError {}

/** A command could not do what it was asked (nothing to stop, ...): its message is the whole story, exit 1. */
export class CommandError extends Error {
  readonly exitCode = 1;
  constructor(message: string) {
    super(message);
    this.name = 'CommandError';
  }
}

/**
 * Every type, and whether the user's input caused it (config, data, model, environment, server
 * settings): the CLI exits 2 for those, as for a config error caught before the start, and 1 for
 * the rest. The one table of types: `Failure` and `isBadInput` are read off it.
 */
const TYPES = {
  /** A config value that cannot work (names the key). */
  InvalidConfig: { badInput: true },
  /** model.name is not a loadable model folder. */
  InvalidModel: { badInput: true },
  /** An environment that cannot be loaded. */
  InvalidEnvironment: { badInput: true },
  /** An SFT dataset row that cannot be used (names the file and line). */
  InvalidSftData: { badInput: true },
  /** The stored config of a run folder does not parse. */
  InvalidRunConfig: { badInput: true },
  /** The run folder holds another run (a different config or kind). */
  ConfigMismatch: { badInput: true },
  /**
   * Our own inference server refused what the run must do, in a way no retry fixes: a missing or
   * wrong API key (401), a forbidden weight folder (403), a route or model it does not have (404),
   * a weight update or reload it rejects (4xx). A configuration problem of the run's servers.
   */
  InferenceRejected: { badInput: true },
  /** The run folder lacks its config (was it prepared?). */
  MissingRunConfig: { badInput: false },
  /** An SFT run folder lacks its plan. */
  MissingSftPlan: { badInput: false },
  /** val.interval is set but there is nothing to validate on. */
  NoValidationData: { badInput: false },
  /** Every rollout of an eval failed. */
  EvalFailed: { badInput: false },
  /** A step has nothing to train: every rollout errored (the message quotes the first errors). */
  NothingToTrain: { badInput: false },
  /** A train step produced weights with NaN or Inf: they are not published (the run diverged). */
  NonFiniteWeights: { badInput: false },
  /**
   * A file the run wrote and still needs is gone from its folder (removed by hand?), or truncated or
   * corrupt and cannot be rebuilt (names the file).
   */
  RunFolderDamaged: { badInput: false },
} as const satisfies Record<string, { badInput: boolean }>;

export type FailureType = keyof typeof TYPES;

/** The failure types by name: `Failure.InvalidConfig === 'InvalidConfig'`. */
export const Failure = Object.fromEntries(Object.keys(TYPES).map((t) => [t, t])) as { readonly [T in FailureType]: T };

/** Whether a failure type (as read off a failure: any string, or none) is one of ours caused by bad input. */
export function isBadInput(type: string | null | undefined): boolean {
  return type != null && Object.hasOwn(TYPES, type) && TYPES[type as FailureType].badInput;
}

/**
 * A failure no retry can fix, as lib/ code raises it (lib/ knows no Temporal): the activity that
 * called the code turns it into a non-retryable failure of `type` (activities/failures.ts).
 */
export class NonRetryableError extends Error {
  override readonly name = 'NonRetryableError';

  constructor(
    message: string,
    readonly type: FailureType,
  ) {
    super(message);
  }
}

/**
 * A failed workflow as one line, `Workflow execution failed: Activity task failed (trainStep): <the
 * activity's error>`, and whether its cause is bad input. Read by fields (message, cause,
 * activityType, type) so that it needs no Temporal import.
 */
export function describeFailure(e: Error): { message: string; badInput: boolean } {
  const parts: string[] = [];
  let badInput = false;
  for (let c: unknown = e; c instanceof Error; c = c.cause) {
    const { activityType, type } = c as { activityType?: string; type?: string | null };
    parts.push(activityType ? `${c.message} (${activityType})` : c.message);
    if (isBadInput(type)) badInput = true;
  }
  return { message: parts.join(': '), badInput };
}

/**
 * A file of the run folder that the run needs is damaged (truncated, corrupt, unreadable as what it
 * should be) or gone: retrying reads the same bytes, so it stops the run, naming the file, unless
 * the caller can rebuild the file (a batch from its rollouts: lib/trainer/runtime.ts).
 */
export class RunFolderDamagedError extends NonRetryableError {
  constructor(
    readonly file: string,
    readonly why: string,
    hint = '',
  ) {
    super(`${file} is damaged: ${why}${hint ? `; ${hint}` : ''}`, Failure.RunFolderDamaged);
  }
}

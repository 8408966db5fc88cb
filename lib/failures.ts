/**
 * The non-retryable failures of activities: one type per cause, raised with
 * `ApplicationFailure.nonRetryable(message, Failure.X)` in activities/ (lib/ throws
 * `NonRetryableError`, which activities/failures.ts converts) and read back by the CLI (`rl`, `sft`,
 * `eval` and `runs show`) from a failed workflow. A failure that retrying can fix (a worker or
 * server that is down, a full queue) is never one of these: Temporal retries it.
 *
 * No imports: the CLI loads this for every command, Temporal client or not.
 */
export const Failure = {
  /** A config value that cannot work (names the key). */
  InvalidConfig: 'InvalidConfig',
  /** model.name is not a loadable model folder. */
  InvalidModel: 'InvalidModel',
  /** An environment that cannot be loaded. */
  InvalidEnvironment: 'InvalidEnvironment',
  /** An SFT dataset row that cannot be used (names the file and line). */
  InvalidSftData: 'InvalidSftData',
  /** The stored config of a run folder does not parse. */
  InvalidRunConfig: 'InvalidRunConfig',
  /** The run folder holds another run (a different config or kind). */
  ConfigMismatch: 'ConfigMismatch',
  /**
   * Our own inference server refused what the run must do, in a way no retry fixes: a missing or
   * wrong API key (401), a forbidden weight folder (403), a route or model it does not have (404),
   * a weight update or reload it rejects (4xx). A configuration problem of the run's servers.
   */
  InferenceRejected: 'InferenceRejected',
  /** The run folder lacks its config (was it prepared?). */
  MissingRunConfig: 'MissingRunConfig',
  /** An SFT run folder lacks its plan. */
  MissingSftPlan: 'MissingSftPlan',
  /** val.interval is set but there is nothing to validate on. */
  NoValidationData: 'NoValidationData',
  /** Every rollout of an eval failed. */
  EvalFailed: 'EvalFailed',
  /** A step has nothing to train: every rollout errored (the message quotes the first errors). */
  NothingToTrain: 'NothingToTrain',
  /** A train step produced weights with NaN or Inf: they are not published (the run diverged). */
  NonFiniteWeights: 'NonFiniteWeights',
} as const;

export type FailureType = (typeof Failure)[keyof typeof Failure];

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
 * The failures caused by what the user gave (config, data, model, environment, server settings):
 * the CLI exits 2 for them, as for a config error caught before the start.
 */
export const BAD_INPUT_FAILURES: ReadonlySet<string> = new Set<FailureType>([
  Failure.InvalidConfig,
  Failure.InvalidModel,
  Failure.InvalidEnvironment,
  Failure.InvalidSftData,
  Failure.InvalidRunConfig,
  Failure.ConfigMismatch,
  Failure.InferenceRejected,
]);

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
    if (type && BAD_INPUT_FAILURES.has(type)) badInput = true;
  }
  return { message: parts.join(': '), badInput };
}

/** The non-retryable failure types and how the CLI reads a failed workflow's chain. */
import { describeFailure, Failure, isBadInput } from '../../lib/failures';

/** A failure chain as Temporal's client gives it: message, cause, activityType, type. */
function chain(type: string | null): Error {
  const activity = Object.assign(new Error('model.name: no config.json'), { type });
  const task = Object.assign(new Error('Activity task failed', { cause: activity }), { activityType: 'prepareRun' });
  return new Error('Workflow execution failed', { cause: task });
}

test('each type names itself', () => {
  for (const [key, value] of Object.entries(Failure)) expect(value).toBe(key);
});

test('the CLI reads bad input off the type anywhere in the chain, and only off our own types', () => {
  expect(describeFailure(chain(Failure.InvalidModel))).toEqual({
    message: 'Workflow execution failed: Activity task failed (prepareRun): model.name: no config.json',
    badInput: true,
  });
  expect(describeFailure(chain(Failure.NothingToTrain)).badInput).toBe(false);
  for (const other of [null, 'Error', 'toString', 'constructor'])
    expect(describeFailure(chain(other)).badInput).toBe(false);
  expect([Failure.ConfigMismatch, Failure.InferenceRejected, Failure.NonFiniteWeights].map(isBadInput)).toEqual([
    true,
    true,
    false,
  ]);
});

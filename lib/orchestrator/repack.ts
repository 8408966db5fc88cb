/**
 * A step's batch packed again from its stored rollouts, off this thread: what the trainer does with
 * a damaged batch (lib/trainer/runtime.ts `BatchRepacker`). The same rollouts and settings give the
 * same bytes, so the batch is the one `packBatch` wrote.
 */
import { readRunConfig } from '../runfolder/config';
import { RunLayout } from '../runfolder/layout';
import { libModule, runInThread } from '../thread';
import { stepBatchInput, type StepBatchResult } from './step-batch';

export async function repackStepBatch(runDir: string, step: number): Promise<void> {
  // CPU-bound for large steps: off this thread, which heartbeats.
  await runInThread<StepBatchResult>(
    libModule('orchestrator/step-batch'),
    'buildStepBatch',
    stepBatchInput(readRunConfig(runDir), new RunLayout(runDir), step),
  );
}

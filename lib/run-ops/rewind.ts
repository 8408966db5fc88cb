/**
 * `ckpt.resume_step = N`, as in prime-rl: a new start of a run continues from its checkpoint of
 * step N. What the run produced after that step is discarded, then redone from it: the trainer
 * restores checkpoints/step_N (the newest one left) and the workflow starts at step N.
 *
 * Deleted in an order that leaves a consistent run folder if a crash interrupts it (the next start
 * redoes what is left): the metrics lines first (a re-walk re-records any step still done), then
 * newer checkpoints (so nothing restores from them), train summaries (the steps' done-markers),
 * weights, then batches before the rollouts they were packed from (a batch never outlives its
 * rollouts), then evals and SFT validations of the discarded versions. SFT batches stay: they are
 * the dataset's, prepared once. In-flight mode: the producer's groups after the last kept step's
 * claim go too (`rewindInFlight`), since they were sampled by discarded policies.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { storedResult } from '../atomic';
import { Failure, NonRetryableError } from '../failures';
import { evalDir } from '../eval/results';
import { verifyCheckpoint } from '../runfolder/checkpoint';
import { listGroups, listSteps, RunLayout } from '../runfolder/layout';
import { truncateStepMetrics } from '../runfolder/metrics';

/** Steps N of `step_N` / `step_N.<ext>` entries of `dir` (none when it does not exist). */
function stepsIn(dir: string): number[] {
  if (!fs.existsSync(dir)) return [];
  return listSteps(fs.readdirSync(dir).map((n) => n.replace(/\.(json|safetensors)$/, '')));
}

/** What is wrong with the run's checkpoint of `step` (undefined: it verifies and is of that step). */
function checkpointProblem(layout: RunLayout, step: number): string | undefined {
  try {
    const meta = verifyCheckpoint(layout.checkpointDir(step));
    return meta.steps === step ? undefined : `it records ${meta.steps} steps`;
  } catch (e) {
    return (e as Error).message;
  }
}

/**
 * The steps ckpt.resume_step can name (their checkpoints verify) and, apart, the corrupt ones with
 * why: a user must not be offered a checkpoint that the resume would then refuse.
 */
function checkpointChoices(layout: RunLayout): string {
  const good: number[] = [];
  const corrupt: string[] = [];
  for (const s of stepsIn(layout.checkpointsRoot)) {
    const problem = checkpointProblem(layout, s);
    if (problem === undefined) good.push(s);
    else corrupt.push(`${s} (${problem})`);
  }
  return `its checkpoints: ${good.length > 0 ? good.join(', ') : 'none'}${corrupt.length > 0 ? `; corrupt: ${corrupt.join(', ')}` : ''}`;
}

function remove(dir: string, keep: (step: number) => boolean, file: (step: number) => string): void {
  for (const s of stepsIn(dir)) if (!keep(s)) fs.rmSync(file(s), { recursive: true, force: true });
}

/**
 * In-flight mode: the groups the kept steps did not claim were sampled by policies the rewind
 * discards (whose version numbers the redone steps reuse), so they are removed, newest first so
 * that the groups left stay numbered without a gap; the restarted producer continues after them.
 */
function rewindInFlight(layout: RunLayout, step: number): void {
  if (!fs.existsSync(layout.inflightGroupsDir)) return;
  const claimed =
    step > 0
      ? (storedResult<{ inFlight?: { next: number } }>(layout.rolloutsSummaryFile(step - 1))?.inFlight?.next ?? 0)
      : 0;
  const discarded = listGroups(fs.readdirSync(layout.inflightGroupsDir))
    .filter((seq) => seq >= claimed)
    .reverse();
  for (const seq of discarded) fs.rmSync(layout.inflightGroupFile(seq), { force: true });
  fs.rmSync(layout.inflightConsumedFile, { force: true });
}

/**
 * Rewinds the run in `runDir` to its checkpoint of `step` (see above); `sft` keeps the batches.
 * A missing or corrupt checkpoint is a non-retryable config error naming ckpt.resume_step.
 * Returns the weights folder of that step, if the run has one.
 */
export function rewindRun(runDir: string, step: number, kind: 'rl' | 'sft'): { weightsDir: string | null } {
  const layout = new RunLayout(runDir);
  const ckpt = layout.checkpointDir(step);
  const pick = 'pick one of those, or leave ckpt.resume_step unset to continue from where the run is';
  if (!fs.existsSync(ckpt)) {
    throw new NonRetryableError(
      `ckpt.resume_step: run ${layout.dir} has no checkpoint of step ${step} (${checkpointChoices(layout)}); ${pick}`,
      Failure.InvalidConfig,
    );
  }
  const problem = checkpointProblem(layout, step);
  if (problem !== undefined) {
    throw new NonRetryableError(
      `ckpt.resume_step: checkpoint ${ckpt} is unusable: ${problem} (${checkpointChoices(layout)}); ${pick}`,
      Failure.InvalidConfig,
    );
  }
  truncateStepMetrics(layout.metricsFile, step);
  remove(
    layout.checkpointsRoot,
    (s) => s <= step,
    (s) => layout.checkpointDir(s),
  );
  remove(
    path.dirname(layout.trainSummaryFile(0)),
    (s) => s < step,
    (s) => layout.trainSummaryFile(s),
  );
  // Weights of version v are written by train step v - 1.
  remove(
    layout.weightsRoot,
    (s) => s <= step,
    (s) => layout.weightsDir(s),
  );
  if (kind === 'rl') {
    remove(
      path.dirname(layout.batchFile(0)),
      (s) => s < step,
      (s) => layout.batchFile(s),
    );
    remove(
      path.dirname(layout.rolloutsDir(0)),
      (s) => s < step,
      (s) => layout.rolloutsDir(s),
    );
    rewindInFlight(layout, step);
  }
  // Evals of discarded versions (results, and the parts they were summed from, keyed by version name).
  remove(
    evalDir(runDir),
    (s) => s <= step,
    (s) => path.join(evalDir(runDir), `step_${s}.json`),
  );
  remove(
    path.join(evalDir(runDir), 'parts'),
    (s) => s <= step,
    (s) => path.join(evalDir(runDir), 'parts', `step_${s}`),
  );
  remove(
    path.dirname(layout.sftValidationFile(0)),
    (s) => s <= step,
    (s) => layout.sftValidationFile(s),
  );
  return { weightsDir: fs.existsSync(layout.weightsDir(step)) ? layout.weightsDir(step) : null };
}

/**
 * `followWandb`: W&B logging of an rl run with a `[wandb]` section, however the run was started
 * (`prime-rl rl`, a SLURM job, `temporal workflow start`). One activity per workflow execution on
 * the run's cpu queue tails metrics.jsonl into the W&B sidecar (lib/run-ops/wandb.ts); Temporal runs it
 * once at a time, and a dead worker's is retried on another (heartbeat timeout), which resumes the
 * same W&B run from the first step W&B lacks. The workflow cancels it when the execution ends or
 * continues as new, and waits: it logs what is left and finishes the W&B run first. W&B never fails
 * the run: when it is off, or its sidecar cannot start or dies, the worker's log says why once and
 * the activity completes.
 */
import { CancelledFailure, Context } from '@temporalio/activity';
import { readRunConfig } from '../lib/runfolder/config';
import { RunLayout } from '../lib/runfolder/layout';
import { startWandb } from '../lib/run-ops/wandb';
import { withHeartbeat } from '../lib/temporal/heartbeat';

export async function followWandb({ runDir }: { runDir: string }): Promise<void> {
  const ctx = Context.current();
  const config = readRunConfig(runDir);
  if (!config.wandb) return;
  const say = (line: string) => ctx.log.info(line);
  const logger = await startWandb({
    settings: config.wandb,
    runName: config.run_name,
    runDir,
    metricsFile: new RunLayout(runDir).metricsFile,
    config,
    say,
  });
  if (!logger) return;
  try {
    // Until the workflow cancels it (a heartbeat brings the cancellation).
    await withHeartbeat(
      () => null,
      () => ctx.cancelled,
    );
  } catch (e) {
    if (!(e instanceof CancelledFailure)) throw e;
    say(`W&B: the run's execution ended (${e.message}); logging the last steps`);
    throw e;
  } finally {
    await logger.close();
  }
}

/** Following a launched run to its end, and the progress parts shared by the train commands. */
import type { TrainMetrics } from '../trainer/types';
import type { LocalRun } from './launch';

/** The loss and throughput parts of a progress line (`-` before the first train step). */
export function trainParts(m: Pick<TrainMetrics, 'loss' | 'tokens_per_s'> | undefined): string[] {
  return [`loss ${m ? m.loss.toExponential(2) : '-'}`, `${m ? Math.round(m.tokens_per_s) : '-'} tok/s`];
}

/**
 * Follows a launched run to its end and hands its result to `done` (the command's summary);
 * Ctrl-C stops the local processes (the workflow stays, resumable).
 */
export async function follow<R>(run: LocalRun<R>, runName: string, done: (result: R) => void): Promise<void> {
  const interrupted = new Promise<never>((_, reject) => {
    const onSignal = (sig: string) =>
      reject(
        Object.assign(new Error(`${sig}: stopped the local processes; run the same command to resume ${runName}`), {
          signal: sig,
        }),
      );
    process.once('SIGINT', () => onSignal('SIGINT'));
    process.once('SIGTERM', () => onSignal('SIGTERM'));
  });
  try {
    done(await Promise.race([run.result, interrupted]));
  } finally {
    await run.stop();
  }
}

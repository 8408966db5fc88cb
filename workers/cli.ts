/**
 * The `prime-rl` process (bin/prime-rl.js): the commands of lib/cli, plus `worker`, which runs a
 * worker process (worker.ts) and so the activities and workflows that lib/ may not import.
 */
import { command } from '../lib/cli/command';
import { cliCommands, main as runMain } from '../lib/cli/main';
import * as schemas from '../lib/config/schemas';

const worker = command({
  summary: 'run a Temporal worker for one pool (cpu, trainer or inference)',
  schema: schemas.workerSchema,
  shared: { keys: schemas.WORKER_SHARED_KEYS, sections: schemas.WORKER_SECTIONS },
  run: async (config) => (await import('./worker')).runWorker(config),
});

/** Runs `prime-rl <argv>` and exits with its code. */
export function main(argv: string[]): void {
  runMain(cliCommands(worker), argv);
}

/**
 * Two runs on one Temporal server at once (issue #48): each polls its own task queues
 * (`prime-rl.<run_name>.cpu|trainer`, the default), so neither takes the other's activities. Both
 * complete with their own counters, and Temporal's history of each shows every activity started by
 * a worker of that run's launcher alone. A third run given the first one's queues explicitly is
 * refused while the first runs.
 */
import { Client, Connection } from '@temporalio/client';
import { ConfigError } from '../lib/failures';
import { launchRun } from '../lib/launch';
import { freePort } from '../lib/net';
import { RunLayout } from '../lib/runfolder/layout';
import { chaosScene, checkRun, tinyRunArgs } from './support/rl-chaos';
import { rlConfig } from './support/setup';

jest.setTimeout(6 * 60_000);

const { modelDir, outputDir, cli } = chaosScene('prime-two-runs-');
const STEPS = 3;

test('two runs on one server at once: own task queues, own workers, own counters', async () => {
  const temporal = { port: await freePort(), uiPort: await freePort(), metricsPort: await freePort() };
  const config = async (name: string, ...extra: string[]) =>
    rlConfig([...(await tinyRunArgs({ name, modelDir, outputDir, steps: STEPS, temporal })), ...extra]);
  const [a, b] = [await config('run-a'), await config('run-b')];
  expect([a.temporal.task_queue, b.temporal.task_queue]).toEqual(['prime-rl.run-a', 'prime-rl.run-b']);

  const first = await launchRun(a, { quiet: true });
  const second = await launchRun(b, { quiet: true }); // finds the first one's dev server
  try {
    const serverPid = first.processes.temporal.pid;
    if (serverPid !== undefined) cli.track(serverPid);
    expect(second.processes.temporal.pid).toBeUndefined();

    // A third run on the first one's queues would share its workers: refused while it runs.
    await expect(
      launchRun(await config('run-c', '--temporal.task-queue', 'prime-rl.run-a'), { quiet: true }),
    ).rejects.toThrow(
      new ConfigError(
        "temporal.task_queue: prime-rl.run-a is the task queue prefix of running workflow run-a, whose workers would take this run's activities (and it theirs); give each run its own (unset = prime-rl.<run_name>)",
      ),
    );

    const [ra, rb] = await Promise.all([first.result, second.result]);
    expect([ra.steps, rb.steps]).toEqual([STEPS, STEPS]);
    checkRun(RunLayout.of(outputDir, 'run-a'), STEPS);
    checkRun(RunLayout.of(outputDir, 'run-b'), STEPS);

    // Who ran each activity: the worker identity Temporal recorded (`<pid>@<host>`).
    const connection = await Connection.connect({ address: `127.0.0.1:${temporal.port}` });
    try {
      const client = new Client({ connection });
      for (const [name, run] of [
        ['run-a', first],
        ['run-b', second],
      ] as const) {
        const own = [run.processes.cpu.pid, run.processes.trainer.pid];
        const { events } = await client.workflow.getHandle(name).fetchHistory();
        const starters = new Set(
          (events ?? [])
            .map((e) => e.activityTaskStartedEventAttributes?.identity)
            .filter((i): i is string => typeof i === 'string')
            .map((i) => Number(i.split('@')[0])),
        );
        expect(starters.size).toBe(2); // its cpu and its trainer worker, no one else
        for (const pid of starters) expect(own).toContain(pid);
      }
    } finally {
      await connection.close();
    }
  } finally {
    await Promise.all([first.stop(), second.stop()]);
  }
});

/**
 * Evaluation as a workflow: environments x model versions. Started by `prime-rl eval` with its
 * config (a `prepareEval` activity resolves the versions), or as a child of `rl` with a ready plan.
 * Versions run one after another (the local server serves one policy at a time), the environments
 * of a version side by side; each version's results land in `<runDir>/eval/<version>.json`.
 */
import { proxyActivities } from '@temporalio/workflow';
import type { EvalPlan } from '../activities/evaluate';
import type { CpuActivities } from '../activities/types';
import type { EvalResults } from '../lib/eval/results';
import type { EvalConfig, TemporalConfig } from '../lib/config/schemas';

export type EvalInput = { config: EvalConfig } | { plan: EvalPlan; temporal: Pick<TemporalConfig, 'task_queue' | 'heartbeat_timeout_s'> };

export interface EvalResult {
  runDir: string;
  results: EvalResults[];
}

const retry = { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute' } as const;

async function evaluation(input: EvalInput): Promise<EvalResult> {
  const temporal = 'config' in input ? input.config.temporal : input.temporal;
  const queue = `${temporal.task_queue}.cpu`;
  const cpu = proxyActivities<CpuActivities>({ taskQueue: queue, startToCloseTimeout: '6 hours', heartbeatTimeout: `${temporal.heartbeat_timeout_s} seconds`, retry });
  const cpuQuick = proxyActivities<CpuActivities>({ taskQueue: queue, startToCloseTimeout: '2 minutes', retry });
  // A write of milliseconds, no heartbeat: retried after the heartbeat timeout if its worker died.
  const cpuWrite = proxyActivities<CpuActivities>({ taskQueue: queue, startToCloseTimeout: `${temporal.heartbeat_timeout_s} seconds`, retry });
  const plan = 'config' in input ? await cpuQuick.prepareEval(input.config) : input.plan;
  const results: EvalResults[] = [];
  for (const version of plan.versions) {
    const metrics = await Promise.all(plan.envs.map((_, env) => cpu.evaluate({ plan, version, env })));
    results.push(await cpuWrite.writeEvalVersion({ plan, version, metrics }));
  }
  return { runDir: plan.runDir, results };
}

// `eval` cannot name a function in strict code; the workflow type is `eval` all the same.
export { evaluation as eval };

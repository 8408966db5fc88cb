/**
 * Evaluation as a workflow: environments x model versions. Started by `prime-rl eval` with its
 * config (a `prepareEval` activity resolves the versions), or as a child of `rl` with a ready plan.
 * Versions run one after another (the local server serves one policy at a time), the environments
 * of a version side by side; each version's results land in `<runDir>/eval/<version>.json`.
 */
import type { EvalPlan } from '../activities/evaluate';
import type { EvalResults } from '../lib/eval/results';
import type { EvalConfig, RunTemporalConfig } from '../lib/config/schemas';
import { runActivities } from './plumbing';

export type EvalInput =
  { config: EvalConfig } | { plan: EvalPlan; temporal: Pick<RunTemporalConfig, 'task_queue' | 'heartbeat_timeout_s'> };

export interface EvalResult {
  runDir: string;
  results: EvalResults[];
}

async function evaluation(input: EvalInput): Promise<EvalResult> {
  const temporal = 'config' in input ? input.config.temporal : input.temporal;
  // An evaluation of every example of an env set can take hours: cpu activities get 6 (not 2).
  const { cpu, cpuQuick, cpuWrite } = runActivities(temporal, '6 hours');
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

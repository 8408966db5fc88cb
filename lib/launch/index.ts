/** The local launcher of `prime-rl rl|sft|eval` (launch.ts says how it works). */
export { launch, type LaunchOptions, type LaunchSpec, type LocalRun } from './launch';
export { launchRun, runRl, type RlProgressView, type RlResultView } from './rl';
export { launchSft, runSft, type SftProgressView, type SftResultView } from './sft';
export { launchEval, runEval, type EvalResultView } from './eval';

/** Eval metrics (avg@k, pass@k), results files per model version, and their table. */
export { passAtK, passAtKValues, summarizeEnvEval, type EnvEvalMetrics, type EvalExample } from './metrics';
export { evalDir, evalResultsFile, readEvalResults, writeEvalResults, type EvalResults } from './results';
export { evalTable, renderEvalTable, type EvalTable } from './table';

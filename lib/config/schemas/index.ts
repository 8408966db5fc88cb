/**
 * Every command's configuration, as zod schemas. These files are the one source of truth: the
 * loader validates against them, `--help` is generated from them, and `--dry-run` prints what they
 * resolve to. Defaults follow the Python prime-rl. Objects are strict: unknown keys are errors.
 *
 * One file per section (common.ts holds the blocks they all use; rl, sft, eval, worker, model-tools
 * and report compose the commands). A file imports only the layers below its own, as declared and
 * linted in eslint.config.mjs (SCHEMA_LAYERS); nothing in this folder imports this index, the
 * public face: `import ... from 'lib/config/schemas'`.
 */
export { serverUrl } from '../urls';
export {
  devMetricsPort,
  runTaskQueue,
  temporalCommandSchema,
  temporalSchema,
  type RunTemporalConfig,
  type TemporalCommandConfig,
  type TemporalConfig,
} from './temporal';
export { SHARDINGS, trainerRankSchema, type TrainerRankConfig } from './dist';
export { trainerSchema, type TrainerConfig } from './trainer';
export { orchestratorSchema, type OrchestratorConfig } from './orchestrator';
export { inferenceSchema, replicaServers, serverSchema, type InferenceConfig } from './inference';
export { RL_SECTIONS, RL_SHARED_AT_LEAST, RL_SHARED_KEYS, rlSchema, type RLConfig } from './rl';
export { sftSchema, type SFTConfig } from './sft';
export { weightBroadcastSchema, type WeightBroadcastConfig } from './weights';
export { slurmSchema, type SlurmConfig } from './slurm';
export { evalSchema, type EvalConfig } from './eval';
export { WORKER_SECTIONS, WORKER_SHARED_KEYS, workerSchema, type WorkerConfig } from './worker';
export { modelCreateSchema, modelPlanSchema, type ModelCreateConfig, type ModelPlanConfig } from './model-tools';
export { reportRunDir, reportSchema } from './report';

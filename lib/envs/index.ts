/** The environment API: what env authors import, and what the orchestrator uses to run envs. */
// Re-exported so env modules outside this package get the same zod without depending on it.
export { z } from 'zod';
export * from './types';
export {
  defineEnvironment,
  instantiate,
  isEnvironmentDefinition,
  type EnvironmentDefinition,
  type EnvironmentSetup,
} from './define';
export { generatedDataset, listDataset, type GeneratedDatasetOptions, type ListDatasetOptions } from './dataset';
export { defineTool, parseToolCalls, runToolCalls, toolSchema, type ParsedToolCall, type Tool } from './tools';
export { extractTag, lastAssistantText, pyStrip } from './parse';
export { scoreRubric } from './rubric';
export { SequenceMatcher, sequenceRatio, type Match } from './difflib';
export { loadEnvironment, resolveEnvironment, BUILTIN_ENV_IDS, type EnvSpec } from './loader';
export { EnvMix, type EnvMixOptions, type MixDraw, type MixEntry } from './mix';
export { EnvPool, type EnvCallResult, type EnvPoolOptions, type EnvPoolStats } from './pool';
export { Rng, uniformInt, uniform, pick, shuffle } from './random';

/**
 * The names a config may give, each list declared once, here at the bottom of lib/: the schemas
 * enumerate them (`z.enum(ADVANTAGE_KINDS)`), and the module that implements them imports the list
 * and lets the compiler check that every name has its implementation and no other
 * (`satisfies Record<AdvantageType, ...>`). Config stays below what it configures: this file
 * imports nothing.
 */

/** `orchestrator.advantage.type`'s group estimators (`BUILTIN_ADVANTAGES`, lib/orchestrator/advantages.ts). */
export const ADVANTAGE_TYPES = ['grpo', 'rloo', 'opo', 'max_rl'] as const;
export type AdvantageType = (typeof ADVANTAGE_TYPES)[number];
/** Every built-in's name (`orchestrator.advantage.type`): the group estimators and `rae`, which is not one. */
export const ADVANTAGE_KINDS = [...ADVANTAGE_TYPES, 'rae'] as const;
export type AdvantageKind = (typeof ADVANTAGE_KINDS)[number];

/** The message roles echo may train (`orchestrator.echo.roles` keys; lib/orchestrator/echo.ts). */
export const ECHO_ROLES = ['system', 'user', 'assistant', 'tool'] as const;
export type EchoRole = (typeof ECHO_ROLES)[number];

/** `distill.type`'s values (docs/algorithms.md, "Distillation"; lib/orchestrator/distill.ts). */
export const DISTILL_TYPES = ['opd', 'sft', 'opsd'] as const;
export type DistillType = (typeof DISTILL_TYPES)[number];
/** `distill.baseline`'s values. */
export const DISTILL_BASELINES = ['none', 'position'] as const;
export type DistillBaseline = (typeof DISTILL_BASELINES)[number];

/**
 * The architecture families by config.json's `model_type` (`model create --arch`): the registry
 * `FAMILIES` (lib/model/families/index.ts) implements each.
 */
export const ARCHS = [
  'llama',
  'qwen2',
  'qwen3',
  'qwen3_moe',
  'qwen3_5_text',
  'qwen3_5',
  'qwen3_5_moe_text',
  'qwen3_5_moe',
] as const;
export type Arch = (typeof ARCHS)[number];

/** `[[env]] id = "verifiers:<module>"`: an unmodified verifiers environment (lib/envs/verifiers/). */
export const VERIFIERS_PREFIX = 'verifiers:';

export function isVerifiersEnv(id: string): boolean {
  return id.startsWith(VERIFIERS_PREFIX);
}

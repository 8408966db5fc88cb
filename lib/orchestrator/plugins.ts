/**
 * The algorithm's units as a run's config names them: the advantage estimator
 * (`orchestrator.advantage`: a built-in `type`, or a plugin `import_path` + `kwargs`) and the
 * rollout filters (`orchestrator.difficulty_filter`, then each of `orchestrator.rollout_filters`).
 *
 * A plugin is found like an environment (lib/modules.ts: `./my_adv.ts` relative to the working
 * directory, an absolute path, or an npm package) and exports a function:
 *
 *   // advantage: the `advantage` or default export; one finite number per rollout of the group
 *   export function advantage(group: AdvantageGroup, kwargs: Record<string, unknown>): number[]
 *   // rollout filter: the `filter` or default export; true keeps the group, false drops it, and a
 *   // string drops it with that reason (the metric key `<import_path>/<reason>`)
 *   export function filter(group: FilterGroup, kwargs: Record<string, unknown>): boolean | string
 *
 * `prepareRun` loads them all when a run starts, so a bad import_path fails the run at once.
 */
import type { AdvantageKind } from '../config/names';
import { requireUserModule } from '../modules';
import {
  builtinEstimator,
  groupAdvantages,
  type AdvantageEstimator,
  type AdvantageGroup,
  type LengthPenaltyConfig,
} from './advantages';
import { difficultyFilter, type DifficultyFilterConfig, type FilterGroup, type RolloutFilter } from './filters';

/**
 * A plugin that threw or returned something unusable: a bug in user code that a retry repeats, so
 * the activities fail the run with it (non-retryable). Recognised by `name` (it crosses threads).
 */
export class PluginError extends Error {
  override name = 'PluginError';
}

export function isPluginError(e: unknown): e is Error {
  return (e as Error | undefined)?.name === 'PluginError';
}

/** Calls a plugin, turning what it throws into a PluginError naming it. */
function callPlugin<T>(what: string, p: PluginConfig, f: () => T): T {
  try {
    return f();
  } catch (err) {
    throw new PluginError(`${what} "${p.import_path}" threw: ${(err as Error)?.message ?? String(err)}`);
  }
}

export interface PluginConfig {
  import_path: string;
  kwargs: Record<string, unknown>;
}

/** Same shape as the config's `orchestrator.advantage` (type is set unless import_path is). */
export interface AdvantageConfig {
  type?: AdvantageKind;
  std_norm: boolean;
  /** rae's EMA decay. */
  decay?: number;
  length_penalty?: LengthPenaltyConfig;
  import_path?: string;
  kwargs: Record<string, unknown>;
}

/** The function a plugin module exports as `name` (or as its default, or as the module itself). */
function pluginFunction(
  key: string,
  what: string,
  exportName: string,
  p: PluginConfig,
): (...args: unknown[]) => unknown {
  let mod: unknown;
  try {
    mod = requireUserModule(
      p.import_path,
      (file, isPath) =>
        new PluginError(
          `${key} = "${p.import_path}": ${isPath ? `module ${file} not found` : 'no such module path (./file.ts) or installed npm package'}`,
        ),
    );
  } catch (err) {
    if (isPluginError(err)) throw err;
    throw new PluginError(
      `${key} = "${p.import_path}": the module failed to load: ${(err as Error)?.message ?? String(err)}`,
    );
  }
  const exports = mod as Record<string, unknown> | undefined;
  const fn = [exports?.[exportName], exports?.default, mod].find((f) => typeof f === 'function');
  if (!fn) {
    throw new PluginError(
      `${key} = "${p.import_path}": the module exports no ${what} (a function exported as \`${exportName}\` or as the default)`,
    );
  }
  return fn as (...args: unknown[]) => unknown;
}

/**
 * A group estimator of the config (not rae, which is no group estimator: lib/orchestrator/step-batch.ts
 * computes it). Throws (naming the key and module) when a plugin cannot load.
 */
export function advantageEstimator(cfg: AdvantageConfig): AdvantageEstimator {
  if (cfg.type === 'rae') throw new Error("advantage type 'rae' is not a group estimator");
  if (cfg.import_path === undefined)
    return builtinEstimator({ type: cfg.type ?? 'grpo', std_norm: cfg.std_norm, length_penalty: cfg.length_penalty });
  const plugin = { import_path: cfg.import_path, kwargs: cfg.kwargs };
  const fn = pluginFunction('orchestrator.advantage.import_path', 'advantage estimator', 'advantage', plugin);
  return {
    name: cfg.import_path,
    compute(g: AdvantageGroup) {
      const adv = callPlugin('advantage estimator', plugin, () => fn(g, plugin.kwargs));
      const n = g.rewards.length;
      if (!Array.isArray(adv) || adv.length !== n || !adv.every((a) => typeof a === 'number' && Number.isFinite(a))) {
        const shown = Array.isArray(adv)
          ? `${adv.length} values [${adv.slice(0, 8).join(', ')}${adv.length > 8 ? ', ...' : ''}]`
          : JSON.stringify(adv);
        throw new PluginError(
          `advantage estimator "${cfg.import_path}" returned ${shown} for a group of ${n} rollouts: it must return ${n} finite numbers`,
        );
      }
      return adv as number[];
    },
  };
}

/** One environment's admission gates (`[[env]] gates`) and what its advantages are computed with. */
export interface EnvGates {
  gates: Record<string, { type: 'advantage_range'; reject_min: number; reject_max: number }>;
  advantage: AdvantageConfig;
  /** Distillation's and sft's groups have no environment advantage to judge: they are admitted. */
  distills: boolean;
}

/**
 * The environments' admission gates as one filter (`gate`, reasons `<gate name>`): an
 * advantage_range gate drops a group whose advantages (by its environment's estimator) all lie in
 * [reject_min, reject_max]; a group of fewer than 2 valid rollouts has none and is admitted, as
 * are distillation's groups and those of rae (its advantages depend on the baselines the step's
 * packing carries on, lib/orchestrator/step-batch.ts).
 */
export function gateFilter(envs: readonly EnvGates[]): RolloutFilter | undefined {
  if (envs.every((e) => Object.keys(e.gates).length === 0)) return undefined;
  const estimators = envs.map((e) =>
    Object.keys(e.gates).length > 0 && !e.distills && e.advantage.type !== 'rae'
      ? advantageEstimator(e.advantage)
      : undefined,
  );
  return {
    name: 'gate',
    check(g) {
      const i = g.envIndex;
      const estimator = i === undefined ? undefined : estimators[i];
      if (!estimator || g.rewards.length < 2) return undefined;
      const n = g.rewards.length;
      const adv = groupAdvantages(estimator, {
        rewards: g.rewards,
        completionTokens: g.completionTokens,
        inputTokens: g.inputTokens ?? new Array<number>(n).fill(0),
        turns: g.turns ?? new Array<number>(n).fill(0),
      });
      for (const [name, gate] of Object.entries(envs[i!].gates))
        if (adv.every((a) => a >= gate.reject_min && a <= gate.reject_max)) return name;
      return undefined;
    },
  };
}

/** The run's rollout filters, in order: the difficulty filter, then the plugins, then the environments' gates. */
export function rolloutFilters(
  o: {
    difficulty_filter: DifficultyFilterConfig;
    rollout_filters: readonly PluginConfig[];
  },
  envs: readonly EnvGates[] = [],
): RolloutFilter[] {
  const plugins = o.rollout_filters.map((p, i): RolloutFilter => {
    const fn = pluginFunction(`orchestrator.rollout_filters[${i}].import_path`, 'rollout filter', 'filter', p);
    return {
      name: p.import_path,
      check(g: FilterGroup) {
        const verdict = callPlugin('rollout filter', p, () => fn(g, p.kwargs));
        if (verdict === true) return undefined;
        if (verdict === false) return 'dropped';
        if (typeof verdict === 'string' && verdict !== '') return verdict;
        throw new PluginError(
          `rollout filter "${p.import_path}" returned ${JSON.stringify(verdict)}: it must return true (keep), false or a reason (drop)`,
        );
      },
    };
  });
  const gates = gateFilter(envs);
  return [difficultyFilter(o.difficulty_filter), ...plugins, ...(gates ? [gates] : [])];
}

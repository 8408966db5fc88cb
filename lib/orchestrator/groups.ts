/**
 * A run's rollouts, group by group, as both modes play them (activities/generate-rollouts.ts one step at a
 * time, activities/inflight-rollouts.ts continuously): what playing needs of the run (`rolloutContext`), an
 * example's group of rollouts (`playGroup`), what the rollout filters see of it, and a step's
 * summary of its groups.
 */
import { verifiersModelName } from '../hub';
import { Failure, NonRetryableError } from '../failures';
import type { RLConfig } from '../config/schemas';
import { distills } from '../config/schemas/distill';
import type { EnvPool } from '../envs/pool';
import type { MixDraw, MixEntry } from '../envs/mix';
import { hash32 } from '../envs/random';
import type { EnvironmentInfo } from '../envs/types';
import { tokenizerOf, type Tokenizer } from '../model/tokenizer';
import { readRunConfig } from '../runfolder/config';
import type { Rollout, RolloutSummary, StoredRollout } from '../runfolder/rollouts';
import { environmentInfo } from '../preflight';
import { InferenceClient, toActivityFailure } from './client';
import { rlClientOptions } from './client-options';
import { demonstration, hintTokens, missingDemonstration } from './self-distill';
import type { FilteredGroups, FilterGroup, RolloutFilter } from './filters';
import { isPluginError, rolloutFilters } from './plugins';
import { TeacherClient } from './teacher';
import { playRollout } from './verifiers-rollout';

/** Rollout seed: a pure function of (run seed, step, example slot, sample), so retries repeat requests. */
export function rolloutSeed(seed: number, step: number, group: number, sample: number): number {
  return hash32(`${seed}/${step}/${group}/${sample}`) & 0x7fffffff;
}

/** What playing a run's rollouts needs: its config, environments, tokenizer and env mix. */
export interface RolloutContext {
  config: RLConfig;
  infos: EnvironmentInfo[];
  /** The policy's model as a verifiers env server names it (lib/hub.ts verifiersModelName). */
  verifiersModel: string;
  tokenizer: Tokenizer;
  mixEntries: MixEntry[];
  examplesPerStep: number;
  /** What each [[env]] entry's distillation needs of its rollouts, by index. */
  distill: EnvDistill[];
}

/** An environment's distillation, as its rollouts are played (docs/algorithms.md, "Distillation"). */
export type EnvDistill =
  | { type: 'none' }
  /** opd: the teacher scores each sample. */
  | { type: 'opd'; teacher: TeacherClient }
  /** sft: the teacher samples the rollouts (its server's token route), its tokens are trained on by cross-entropy. */
  | { type: 'sft'; client: InferenceClient; baseUrl: string; model: string; apiKeyVar?: string }
  /** opsd: the policy's servers score each sample after the example's demonstration. */
  | { type: 'opsd'; demoKey: string; template: string; scorers: TeacherClient[] };

/** Each [[env]] entry's distillation: its own [distill], or the run's; teachers shared between entries. */
function envDistills(config: RLConfig): EnvDistill[] {
  const o = config.orchestrator;
  const livenessMs = config.temporal.heartbeat_timeout_s * 1000;
  const teachers = new Map<string, TeacherClient>();
  return config.env.map((e, i): EnvDistill => {
    const d = e.distill ?? config.distill;
    if (!distills(d)) return { type: 'none' };
    const key = e.distill ? `env[${i}].distill.teacher` : 'distill.teacher';
    if (d.type === 'opsd') {
      const server = rlClientOptions(config);
      // The policy's own servers, each scoring the samples of its round-robin share.
      const scorers = o.base_urls.map(
        (base_url) =>
          new TeacherClient(
            { base_url, api_key_var: server.apiKeyVar, key: 'orchestrator.base_urls (self-distillation)' },
            { livenessMs },
          ),
      );
      return { type: 'opsd', demoKey: d.demo_key!, template: d.template!, scorers };
    }
    const t = d.teacher!;
    if (d.type === 'sft')
      return {
        type: 'sft',
        client: new InferenceClient([t.base_url], {
          apiKeyVar: t.api_key_var,
          apiKeySetting: `${key}.api_key_var`,
          livenessMs,
        }),
        baseUrl: t.base_url,
        model: t.served_model ?? verifiersModelName(t.model),
        apiKeyVar: t.api_key_var,
      };
    const id = JSON.stringify(t);
    let teacher = teachers.get(id);
    if (!teacher) teachers.set(id, (teacher = new TeacherClient({ ...t, key }, { livenessMs })));
    return { type: 'opd', teacher };
  });
}

export async function rolloutContext(runDir: string, pool: EnvPool): Promise<RolloutContext> {
  const config = readRunConfig(runDir);
  const o = config.orchestrator;
  if (config.env.length === 0)
    throw new NonRetryableError('no environments configured ([[env]])', Failure.InvalidConfig);
  const infos: EnvironmentInfo[] = [];
  for (const e of config.env) infos.push(await environmentInfo(pool, e));
  return {
    config,
    infos,
    verifiersModel: verifiersModelName(o.model.name),
    tokenizer: tokenizerOf(o.model.name),
    mixEntries: config.env.map((e, i) => ({ weight: e.weight, size: infos[i].size.train })),
    examplesPerStep: o.batch_size / o.rollouts_per_example,
    distill: envDistills(config),
  };
}

export type ExampleResult = Awaited<ReturnType<EnvPool['example']>>;

/** The train examples of `draws`. */
export function examplesOf(ctx: RolloutContext, pool: EnvPool, draws: readonly MixDraw[]): Promise<ExampleResult[]> {
  return Promise.all(draws.map((d) => pool.example(ctx.config.env[d.env], 'train', d.index, ctx.config.seed)));
}

/** One group to play: an example's rollouts_per_example rollouts, seeded by (seedStep, group, sample). */
export interface GroupTask {
  draw: MixDraw;
  example: ExampleResult;
  /** Step of the seeds (rolloutSeed). */
  seedStep: number;
  group: number;
  round: number;
  /** Recorded as the version of a rollout whose example could not be loaded (nothing sampled). */
  policyVersion: number;
}

/**
 * Plays one group; `onRollout` after each finished rollout. The environment's distillation: a
 * teacher's logprobs (opd) or the policy's after the example's demonstration (opsd) are added to
 * the valid rollouts; with sft, the teacher plays them.
 */
export async function playGroup(
  ctx: RolloutContext,
  pool: EnvPool,
  client: InferenceClient,
  { draw, example, seedStep, group, round, policyVersion }: GroupTask,
  onRollout: () => void = () => {},
): Promise<StoredRollout[]> {
  const o = ctx.config.orchestrator;
  const env = ctx.config.env[draw.env];
  const distill = ctx.distill[draw.env] ?? { type: 'none' };
  const sampler = distill.type === 'sft' ? distill : undefined;
  // opsd needs the demonstration before anything is played: a row without it is bad input.
  let hint: number[] | undefined;
  if (distill.type === 'opsd' && example.ok) {
    const demo = demonstration(example.value, distill.demoKey);
    if (demo === undefined)
      throw new NonRetryableError(
        missingDemonstration(distill.demoKey, env.id, draw.index, example.value),
        Failure.InvalidConfig,
      );
    hint = hintTokens(ctx.tokenizer, distill.template, demo);
  }
  const rollouts = await Promise.all(
    Array.from({ length: o.rollouts_per_example }, async (_, sample): Promise<StoredRollout> => {
      const seed = rolloutSeed(ctx.config.seed, seedStep, group, sample);
      const base = { env: env.id, envIndex: draw.env, group, round, exampleIndex: draw.index, sample, seed };
      const rollout: Rollout = example.ok
        ? await playRollout(
            {
              env,
              info: ctx.infos[draw.env],
              example: example.value,
              seed,
              seqLen: o.seq_len,
              sampling: o.sampling,
              routerReplay: ctx.config.trainer.moe.router_replay,
            },
            pool,
            sampler?.client ?? client,
            ctx.tokenizer,
            // A verifiers env server calls an inference server itself: one per group, round robin.
            sampler
              ? {
                  baseUrl: sampler.baseUrl,
                  model: sampler.model,
                  renderer: o.renderer,
                  apiKeyVar: sampler.apiKeyVar,
                  policyVersion,
                }
              : {
                  baseUrl: o.base_urls[group % o.base_urls.length],
                  model: ctx.verifiersModel,
                  renderer: o.renderer,
                  // The weights change while the rollout runs: each token's version from the server's records.
                  recordVersions: o.in_flight.enabled,
                  apiKeyVar: rlClientOptions(ctx.config).apiKeyVar,
                  policyVersion,
                },
          )
        : {
            completion: [],
            samples: [],
            reward: 0,
            metrics: {},
            turns: 0,
            completionTokens: 0,
            truncated: false,
            policyVersion,
            newestPolicyVersion: policyVersion,
            error: `example: ${example.error}`,
          };
      onRollout();
      // A teacher's rollout is no sample of the policy's: in-flight mode never finds it stale.
      return { ...base, ...rollout, ...(sampler ? { teacher: true } : {}) };
    }),
  );
  const valid = rollouts.filter((r) => !r.error).flatMap((r) => r.samples);
  if (distill.type === 'opd') await distill.teacher.annotate(valid, o.seq_len);
  if (distill.type === 'opsd')
    await distill.scorers[group % distill.scorers.length].annotate(valid, ctx.config.inference.seq_len, hint);
  return rollouts;
}

/** What the rollout filters see of a group. */
export function filterView(rollouts: readonly StoredRollout[]): FilterGroup {
  const valid = rollouts.filter((r) => !r.error);
  const tokens = (r: StoredRollout) => r.samples.flat().reduce((n, s) => n + s.tokens.length, 0);
  return {
    env: rollouts[0].env,
    ...(rollouts[0].envIndex !== undefined ? { envIndex: rollouts[0].envIndex } : {}),
    exampleIndex: rollouts[0].exampleIndex,
    group: rollouts[0].group,
    round: rollouts[0].round,
    rewards: valid.map((r) => r.reward),
    completionTokens: valid.map((r) => r.completionTokens),
    inputTokens: valid.map((r) => tokens(r) - r.completionTokens),
    turns: valid.map((r) => r.turns),
    errored: rollouts.length - valid.length,
  };
}

/** The run's rollout filters; a plugin that fails to load stops the run. */
export function loadFilters(ctx: RolloutContext): RolloutFilter[] {
  const c = ctx.config;
  try {
    return rolloutFilters(
      c.orchestrator,
      c.env.map((e) => ({
        gates: e.gates ?? {},
        advantage: e.advantage ?? c.orchestrator.advantage,
        distills: distills(e.distill ?? c.distill),
      })),
    );
  } catch (err) {
    throw new NonRetryableError((err as Error).message, Failure.InvalidConfig);
  }
}

/**
 * A step's summary from its groups: stats over every rollout generated, dropped groups included
 * (what the policy scores: the filters would bias it).
 */
export function summarize(
  step: number,
  dir: string,
  policyVersion: number,
  played: FilteredGroups<StoredRollout[]>,
  seconds: number,
): RolloutSummary {
  const all = [...played.kept, ...played.dropped.map((d) => d.group)].flat();
  const valid = all.filter((r) => !r.error);
  const rewards = valid.map((r) => r.reward);
  const mean = rewards.reduce((a, b) => a + b, 0) / Math.max(1, rewards.length);
  const variance = rewards.reduce((a, r) => a + (r - mean) ** 2, 0) / Math.max(1, rewards.length);
  const rubric: Record<string, number> = {};
  for (const r of valid)
    for (const [k, v] of Object.entries(r.metrics)) rubric[k] = (rubric[k] ?? 0) + v / valid.length;
  return {
    step,
    path: dir,
    policyVersion,
    rollouts: all.length,
    errored: all.length - valid.length,
    truncated: all.filter((r) => r.truncated).length,
    rewardMean: mean,
    rewardStd: Math.sqrt(variance),
    rubric,
    completionTokens: all.reduce((a, r) => a + r.completionTokens, 0),
    seconds,
    errors: all
      .filter((r) => r.error)
      .slice(0, 3)
      .map((r) => r.error!),
    filter: played.metrics,
  };
}

/**
 * An error of playing rollouts, as the activity fails: a request the server refuses as invalid
 * errored only its rollout (runRollout); one it refuses for the whole run (a wrong API key, a
 * forbidden weight folder) ends the run here, and so does a rollout filter plugin that fails (a
 * retry would repeat it).
 */
export function rolloutFailure(e: unknown): unknown {
  if (isPluginError(e)) return new NonRetryableError(e.message, Failure.InvalidConfig);
  return toActivityFailure(e);
}

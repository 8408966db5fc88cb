/**
 * `generateRollouts` (cpu queue): step n's rollouts, played against the inference servers at the
 * policy version the workflow chose, scored by the environments' rubrics, judged by the rollout
 * filters (dropped groups replaced by fresh examples, lib/orchestrator/filters.ts), stored in
 * `rollouts/step_n/`. Idempotent by (run, step): a finished step's summary is returned as stored;
 * a step that crashed half-way is redone from scratch with the same seeds, so the same requests.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { resolveModelDir, verifiersModelName } from '../lib/hub';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import { storedResult, writeDirAtomic } from '../lib/atomic';
import type { RLConfig } from '../lib/config/schemas';
import type { EnvPool } from '../lib/envs/pool';
import { EnvMix, type MixDraw, type MixEntry } from '../lib/envs/mix';
import { hash32 } from '../lib/envs/random';
import type { EnvironmentInfo } from '../lib/envs/types';
import { Tokenizer } from '../lib/model/tokenizer';
import { InferenceClient, toActivityFailure } from '../lib/orchestrator/client';
import { rlClientOptions } from '../lib/orchestrator/client-options';
import {
  playFiltered,
  refillDraws,
  type FilteredGroups,
  type FilterGroup,
  type FilterMetrics,
  type RolloutFilter,
} from '../lib/orchestrator/filters';
import type { InFlightClaim } from '../lib/orchestrator/inflight';
import { isPluginError, rolloutFilters } from '../lib/orchestrator/plugins';
import { promptTooLong, renderPrompt, type Rollout } from '../lib/orchestrator/rollout';
import { TeacherClient } from '../lib/orchestrator/teacher';
import { playRollout } from '../lib/orchestrator/verifiers-rollout';
import { readRunConfig } from '../lib/run/config';
import { RunLayout } from '../lib/run/layout';
import { withHeartbeat } from './heartbeat';
import { environmentInfo } from './preflight';

export interface RolloutStepInput {
  runDir: string;
  step: number;
  /** Policy version the servers must serve for this step's rollouts. */
  policyVersion: number;
}

export interface RolloutSummary {
  step: number;
  path: string;
  policyVersion: number;
  /** Rollouts generated, refills and dropped groups included (as errored, truncated, the rewards, rubric and tokens). */
  rollouts: number;
  errored: number;
  truncated: number;
  rewardMean: number;
  rewardStd: number;
  /** Mean of each rubric function over valid rollouts. */
  rubric: Record<string, number>;
  completionTokens: number;
  seconds: number;
  /** The first few errors, for the UI. */
  errors: string[];
  /** The rollout filters: groups dropped (by reason), refill rounds, groups still missing. */
  filter: FilterMetrics;
  /** In-flight mode: the groups the step took and their off-policy distance (activities/inflight.ts). */
  inFlight?: InFlightClaim;
}

/** One stored rollout: the packing input plus what a person inspecting the run wants to read. */
export interface StoredRollout extends Rollout {
  env: string;
  /** Slot of the group in the step; refill groups continue after the step's own. */
  group: number;
  /** 0 for the step's own examples, r for refill round r (lib/orchestrator/filters.ts). */
  round: number;
  exampleIndex: number;
  sample: number;
  seed: number;
}

/** The groups the rollout filters dropped, each rollout with `dropped`: the filter's reason. */
const DROPPED = 'dropped.jsonl';

/** The rollouts of a step's folder, one JSON line each. */
export function rolloutsFile(dir: string): string {
  return path.join(dir, RunLayout.ROLLOUTS_FILE);
}

export function readRollouts(dir: string): StoredRollout[] {
  return fs
    .readFileSync(rolloutsFile(dir), 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as StoredRollout);
}

/** What the cpu worker shares between activity calls. */
export interface RolloutDeps {
  pool: EnvPool;
}

/** Tokenizers by model (a folder or a Hugging Face name), loaded once per worker process. */
const tokenizers = new Map<string, Tokenizer>();
export function tokenizerOf(model: string): Tokenizer {
  let t = tokenizers.get(model);
  if (!t) {
    t = Tokenizer.fromDir(resolveModelDir(model));
    tokenizers.set(model, t);
  }
  return t;
}

/** Rollout seed: a pure function of (run seed, step, example slot, sample), so retries repeat requests. */
export function rolloutSeed(seed: number, step: number, group: number, sample: number): number {
  return hash32(`${seed}/${step}/${group}/${sample}`) & 0x7fffffff;
}

/** Examples of each environment's train split looked at before calling a seq_len too short for all of them. */
const PROMPT_PROBE = 32;

/**
 * A config whose seq_len leaves no room to generate after any of the environments' prompts trains
 * nothing: that fails the run (retrying cannot fix it). Only looked into when every prompt of the
 * step is too long; if the environments have prompts that fit (the first PROMPT_PROBE examples of
 * each), this step drew long ones by chance: their rollouts are skipped and it trains nothing.
 */
async function checkPromptsFit(
  stepPrompts: readonly number[],
  probe: () => Promise<number[]>,
  seqLen: number,
  step: number,
): Promise<void> {
  if (stepPrompts.length === 0 || stepPrompts.some((n) => !promptTooLong(n, seqLen))) return;
  const probed = await probe();
  if (probed.some((n) => !promptTooLong(n, seqLen))) return;
  const shortest = Math.min(...stepPrompts, ...probed);
  throw ApplicationFailure.nonRetryable(
    `orchestrator.seq_len (${seqLen}) is too short for the environments' prompts: the ${stepPrompts.length} prompts of step ${step} and ` +
      `the first ${PROMPT_PROBE} of each environment are ${shortest} tokens or longer, so no rollout could generate a token. seq_len must hold ` +
      `a prompt plus its completion: raise seq_len (the shared key that fills trainer, orchestrator and inference) above ${shortest}`,
    Failure.InvalidConfig,
  );
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
  /** Online distillation's teacher (`[distill] teacher`), when set. */
  teacher?: TeacherClient;
}

export async function rolloutContext(runDir: string, pool: EnvPool): Promise<RolloutContext> {
  const config = readRunConfig(runDir);
  const o = config.orchestrator;
  if (config.env.length === 0)
    throw ApplicationFailure.nonRetryable('no environments configured ([[env]])', Failure.InvalidConfig);
  const infos: EnvironmentInfo[] = [];
  for (const e of config.env) infos.push(await environmentInfo(pool, e));
  return {
    config,
    infos,
    verifiersModel: verifiersModelName(o.model.name),
    tokenizer: tokenizerOf(o.model.name),
    mixEntries: config.env.map((e, i) => ({ weight: e.weight, size: infos[i].size.train })),
    examplesPerStep: o.batch_size / o.rollouts_per_example,
    teacher: config.distill?.teacher
      ? new TeacherClient(config.distill.teacher, { livenessMs: config.temporal.heartbeat_timeout_s * 1000 })
      : undefined,
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

/** Plays one group; `onRollout` after each finished rollout. With a teacher, its logprobs are added to the valid rollouts. */
export async function playGroup(
  ctx: RolloutContext,
  pool: EnvPool,
  client: InferenceClient,
  { draw, example, seedStep, group, round, policyVersion }: GroupTask,
  onRollout: () => void = () => {},
): Promise<StoredRollout[]> {
  const o = ctx.config.orchestrator;
  const env = ctx.config.env[draw.env];
  const rollouts = await Promise.all(
    Array.from({ length: o.rollouts_per_example }, async (_, sample): Promise<StoredRollout> => {
      const seed = rolloutSeed(ctx.config.seed, seedStep, group, sample);
      const base = { env: env.id, group, round, exampleIndex: draw.index, sample, seed };
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
            client,
            ctx.tokenizer,
            // A verifiers env server calls an inference server itself: one per group, round robin.
            {
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
      return { ...base, ...rollout };
    }),
  );
  await ctx.teacher?.annotate(
    rollouts.filter((r) => !r.error).flatMap((r) => r.samples),
    o.seq_len,
  );
  return rollouts;
}

/** What the rollout filters see of a group. */
export function filterView(rollouts: readonly StoredRollout[]): FilterGroup {
  const valid = rollouts.filter((r) => !r.error);
  return {
    env: rollouts[0].env,
    exampleIndex: rollouts[0].exampleIndex,
    group: rollouts[0].group,
    round: rollouts[0].round,
    rewards: valid.map((r) => r.reward),
    completionTokens: valid.map((r) => r.completionTokens),
    errored: rollouts.length - valid.length,
  };
}

/** The run's rollout filters; a plugin that fails to load stops the run. */
export function loadFilters(ctx: RolloutContext): RolloutFilter[] {
  try {
    return rolloutFilters(ctx.config.orchestrator);
  } catch (err) {
    throw ApplicationFailure.nonRetryable((err as Error).message, Failure.InvalidConfig);
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
 * Writes a step's rollouts folder at once (temp + rename): the kept groups for packing, the dropped
 * ones (each rollout with `dropped`: the filter's reason) beside them, and the summary last read
 * back by a retry.
 */
export function writeStepRollouts(
  dir: string,
  kept: readonly StoredRollout[][],
  dropped: readonly { group: StoredRollout[]; reason: string }[],
  summary: RolloutSummary,
  extra: (tmp: string) => void = () => {},
): void {
  writeDirAtomic(dir, (tmp) => {
    const lines = (groups: readonly (readonly object[])[]) =>
      groups
        .flat()
        .map((r) => JSON.stringify(r) + '\n')
        .join('');
    fs.writeFileSync(path.join(tmp, RunLayout.ROLLOUTS_FILE), lines(kept));
    fs.writeFileSync(
      path.join(tmp, DROPPED),
      lines(dropped.map((d) => d.group.map((r) => ({ ...r, dropped: d.reason })))),
    );
    extra(tmp);
    fs.writeFileSync(path.join(tmp, RunLayout.ROLLOUTS_SUMMARY), JSON.stringify(summary, null, 1));
  });
}

/** A step's stored summary (its rollouts folder is complete), or undefined. */
export function storedSummary(runDir: string, step: number): RolloutSummary | undefined {
  return storedResult<RolloutSummary>(new RunLayout(runDir).rolloutsSummaryFile(step));
}

/**
 * An error of playing rollouts, as the activity fails: a request the server refuses as invalid
 * errored only its rollout (runRollout); one it refuses for the whole run (a wrong API key, a
 * forbidden weight folder) ends the run here, and so does a rollout filter plugin that fails (a
 * retry would repeat it).
 */
export function rolloutFailure(e: unknown): unknown {
  if (isPluginError(e)) return ApplicationFailure.nonRetryable(e.message, Failure.InvalidConfig);
  return toActivityFailure(e);
}

export function createRolloutActivities({ pool }: RolloutDeps) {
  return {
    async generateRollouts({ runDir, step, policyVersion }: RolloutStepInput): Promise<RolloutSummary> {
      const layout = new RunLayout(runDir);
      const dir = layout.rolloutsDir(step);
      const stored = storedSummary(runDir, step);
      if (stored) return stored;

      const started = Date.now();
      const ctx = await rolloutContext(runDir, pool);
      const { config, infos, tokenizer, mixEntries, examplesPerStep } = ctx;
      const o = config.orchestrator;
      const mix = new EnvMix(mixEntries, { seed: config.seed, examplesPerStep });
      const draws = mix.sample(step);
      const examples = await examplesOf(ctx, pool, draws);
      const promptTokens = (env: number, e: ExampleResult) =>
        e.ok ? [renderPrompt(tokenizer, e.value.prompt, infos[env].tools).ids.length] : [];
      const probe = async () => {
        const lengths: number[] = [];
        for (const [i, e] of config.env.entries()) {
          for (let index = 0; index < Math.min(PROMPT_PROBE, infos[i].size.train ?? PROMPT_PROBE); index++) {
            lengths.push(...promptTokens(i, await pool.example(e, 'train', index, config.seed)));
          }
        }
        return lengths;
      };
      await checkPromptsFit(
        examples.flatMap((e, g) => promptTokens(draws[g].env, e)),
        probe,
        o.seq_len,
        step,
      );

      const filters = loadFilters(ctx);
      const refill = refillDraws(mixEntries, {
        seed: config.seed,
        examplesPerStep,
        maxRefillRounds: o.max_refill_rounds,
      });
      let total = o.batch_size;
      let done = 0;
      let phase = 'loading weights';
      const played = await withHeartbeat(
        () => ({ phase, done, total }),
        async () => {
          const client = new InferenceClient(o.base_urls, rlClientOptions(config));
          await client.ensurePolicy({ version: policyVersion, weightDir: layout.weightsDir(policyVersion) });
          phase = 'generating';
          const play = (draw: MixDraw, group: number, round: number, example: ExampleResult) =>
            playGroup(ctx, pool, client, { draw, example, seedStep: step, group, round, policyVersion }, () => done++);
          return playFiltered<StoredRollout[]>({
            groups: examplesPerStep,
            maxRefillRounds: o.max_refill_rounds,
            filters,
            async play(round, firstSlot, count) {
              if (round === 0) return Promise.all(draws.map((d, g) => play(d, g, 0, examples[g])));
              phase = `refill round ${round}`;
              total += count * o.rollouts_per_example;
              const fresh = refill(step, round, count);
              const freshExamples = await examplesOf(ctx, pool, fresh);
              return Promise.all(fresh.map((d, k) => play(d, firstSlot + k, round, freshExamples[k])));
            },
            view: filterView,
          });
        },
      ).catch((e) => {
        throw rolloutFailure(e);
      });
      // Only the kept groups are stored for packing; the dropped ones are kept beside them for
      // whoever inspects the step.
      const summary = summarize(step, dir, policyVersion, played, (Date.now() - started) / 1000);
      writeStepRollouts(dir, played.kept, played.dropped, summary);
      return summary;
    },
  };
}

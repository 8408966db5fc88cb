/**
 * `generateRollouts` (cpu queue): step n's rollouts, played against the inference servers at the
 * policy version the workflow chose, scored by the environments' rubrics, judged by the rollout
 * filters (dropped groups replaced by fresh examples, lib/orchestrator/filters.ts), stored in
 * `rollouts/step_n/`. Idempotent by (run, step): a finished step's summary is returned as stored;
 * a step that crashed half-way is redone from scratch with the same seeds, so the same requests.
 */
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import type { EnvPool } from '../lib/envs/pool';
import { EnvMix, type MixDraw } from '../lib/envs/mix';
import { mapAdaptive } from '../lib/orchestrator/adaptive';
import { InferenceClient } from '../lib/orchestrator/client';
import { ConcurrencyController } from '../lib/orchestrator/concurrency';
import { rlClientOptions } from '../lib/orchestrator/client-options';
import { playFiltered, refillDraws } from '../lib/orchestrator/filters';
import {
  examplesOf,
  filterView,
  loadFilters,
  playGroup,
  rolloutContext,
  rolloutFailure,
  summarize,
  type ExampleResult,
} from '../lib/orchestrator/groups';
import { promptTooLong, renderPrompt } from '../lib/orchestrator/token-rollout';
import { RunLayout } from '../lib/runfolder/layout';
import { storedSummary, writeStepRollouts, type RolloutSummary, type StoredRollout } from '../lib/runfolder/rollouts';
import { withHeartbeat } from '../lib/temporal/heartbeat';

export interface RolloutStepInput {
  runDir: string;
  step: number;
  /** Policy version the servers must serve for this step's rollouts. */
  policyVersion: number;
}

/** What the cpu worker shares between activity calls. */
export interface RolloutDeps {
  pool: EnvPool;
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
      const concurrency = new ConcurrencyController(o.concurrency, o.seq_len);
      const played = await withHeartbeat(
        () => ({ phase, done, total, inflight: concurrency.limit }),
        async () => {
          const client = new InferenceClient(o.base_urls, rlClientOptions(config));
          await client.ensurePolicy({ version: policyVersion, weightDir: layout.weightsDir(policyVersion) });
          phase = 'generating';
          // Groups start while their rollouts fit the concurrency (orchestrator.concurrency), which
          // follows the servers' KV cache; each finished rollout is reported as it finishes.
          let inFlight = 0;
          const playOne = (draw: MixDraw, group: number, round: number, example: ExampleResult) => {
            inFlight += o.rollouts_per_example;
            return playGroup(ctx, pool, client, { draw, example, seedStep: step, group, round, policyVersion }, () => {
              done++;
              concurrency.finished(--inFlight);
            });
          };
          const play = (round: number, draws: MixDraw[], examples: ExampleResult[], firstSlot: number) =>
            mapAdaptive(
              draws.map((d, k) => ({ d, k })),
              ({ d, k }) => playOne(d, firstSlot + k, round, examples[k]),
              {
                controller: concurrency,
                read: () => client.readings(),
                weight: () => o.rollouts_per_example,
                reportFinished: false,
              },
            );
          return playFiltered<StoredRollout[]>({
            groups: examplesPerStep,
            maxRefillRounds: o.max_refill_rounds,
            filters,
            async play(round, firstSlot, count) {
              if (round === 0) return play(0, draws, examples, 0);
              phase = `refill round ${round}`;
              total += count * o.rollouts_per_example;
              const fresh = refill(step, round, count);
              const freshExamples = await examplesOf(ctx, pool, fresh);
              return play(round, fresh, freshExamples, firstSlot);
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

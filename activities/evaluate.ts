/**
 * Evaluation on the cpu queue. `prepareEval` turns an eval config into a plan (environments x
 * model versions); `evaluate` plays one (version, environment): `num_examples` eval-split examples,
 * k samples each, against the local inference server serving that version (token in/out, as in
 * RL) or an external OpenAI-compatible API (chat completions, text in/out); `writeEvalVersion`
 * stores a version's metrics as `<runDir>/eval/<version>.json`. Each (version, environment) result
 * is kept under `eval/parts/`, keyed by everything that determines it, so retries and restarts
 * never redo finished work.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { verifiersModelName } from '../lib/hub';
import { ApplicationFailure } from '@temporalio/common';
import { Failure } from '../lib/failures';
import { storedJson, writeFileAtomic } from '../lib/atomic';
import { serverUrl, type EvalConfig } from '../lib/config/schemas';
import {
  summarizeEnvEval,
  writeEvalResults,
  evalDir,
  type EnvEvalMetrics,
  type EvalExample,
  type EvalResults,
} from '../lib/eval';
import { evalEnvs, evalExampleCount, type EvalEnv } from '../lib/eval/envs';
import type { EnvPool } from '../lib/envs/pool';
import { hash32 } from '../lib/envs/random';
import { tokenizerOf } from '../lib/model/tokenizer';
import { runChatRollout } from '../lib/orchestrator/chat-rollout';
import { InferenceClient, toActivityFailure, type InferenceClientOptions } from '../lib/orchestrator/client';
import type { SamplingSettings } from '../lib/orchestrator/token-rollout';
import { playRollout, runVerifiersRollout } from '../lib/orchestrator/verifiers-rollout';
import { mapAdaptive } from '../lib/orchestrator/adaptive';
import { ConcurrencyController, fixedLimit, type ConcurrencyBounds } from '../lib/orchestrator/concurrency';
import { isVerifiersEnv } from '../lib/config/names';
import { listSteps, RunLayout } from '../lib/runfolder/layout';
import { withHeartbeat } from '../lib/temporal/heartbeat';
import { checkEnvironments, checkModel, environmentInfo } from '../lib/preflight';

/** One model version to evaluate. */
export interface EvalVersion {
  /** `base`, `step_N`, or the external API's model name: the results file name. */
  name: string;
  /** Training step of the weights; null for the base model or an API. */
  step: number | null;
  /** Local server: policy version to serve (0 = the model it started with) and its weights. */
  policyVersion: number;
  weightDir?: string;
}

/** Where samples come from: the local inference server(s), or an external OpenAI-compatible API. */
export type EvalTarget =
  | {
      kind: 'local';
      baseUrls: string[];
      /** The served model, a folder or a Hugging Face name: its tokenizer and chat template. */
      modelDir: string;
      /** The renderer verifiers env servers render with (orchestrator.renderer). */
      renderer?: Record<string, unknown>;
      /** API key and in-flight bound (no bound: an eval keeps CONCURRENCY rollouts in flight). */
      client?: InferenceClientOptions;
    }
  | {
      kind: 'api';
      baseUrl: string;
      model: string;
      apiKeyVar?: string;
      /** The renderer a verifiers env server renders with (the model's name resolves one when unset). */
      renderer?: Record<string, unknown>;
    };

export interface EvalPlan {
  runDir: string;
  envs: EvalEnv[];
  /** Rollouts in flight at once (lib/orchestrator/concurrency.ts); absent in plans made before it existed. */
  concurrency?: ConcurrencyBounds;
  numExamples: number;
  rolloutsPerExample: number;
  sampling: SamplingSettings;
  seqLen: number;
  seed: number;
  target: EvalTarget;
  versions: EvalVersion[];
}

export interface EvaluateInput {
  plan: EvalPlan;
  version: EvalVersion;
  /** Index into plan.envs. */
  env: number;
}

/** Without `concurrency` (plans made before it existed): 64 rollouts in flight, as then. */
const DEFAULT_CONCURRENCY: ConcurrencyBounds = { initial_inflight: 64, min_inflight: 64, max_inflight: 64 };

/** One rollout of an eval as its part file keeps it (the eval resumes from them). */
interface EvalRollout {
  task: number;
  reward: number;
  completionTokens: number;
  error?: string;
}

/**
 * The finished rollouts of a (version, environment) an earlier attempt stored, by task. Appended
 * one JSON line each as they finish: a line cut short by a crash is the last, and is dropped.
 */
function storedRollouts(file: string): Map<number, EvalRollout> {
  const out = new Map<number, EvalRollout>();
  if (!fs.existsSync(file)) return out;
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line === '') continue;
    try {
      const r = JSON.parse(line) as EvalRollout;
      out.set(r.task, r);
    } catch {
      // the torn last line of an interrupted attempt: played again
    }
  }
  return out;
}

/** Results keys: env ids, suffixed where one id is evaluated with several args. */
function envKeys(envs: readonly EvalEnv[]): string[] {
  return envs.map((e, i) => (envs.filter((o) => o.id === e.id).length > 1 ? `${e.id}#${i}` : e.id));
}

function partFile(input: EvaluateInput): string {
  const { plan, version, env } = input;
  const key = {
    env: plan.envs[env],
    n: plan.numExamples,
    k: plan.rolloutsPerExample,
    sampling: plan.sampling,
    seqLen: plan.seqLen,
    seed: plan.seed,
    target: plan.target,
    version,
  };
  const hash = hash32(JSON.stringify(key)).toString(16).padStart(8, '0');
  return path.join(evalDir(plan.runDir), 'parts', version.name.replace(/[^A-Za-z0-9._-]/g, '_'), `${env}-${hash}.json`);
}

/** The plan of `prime-rl eval`: versions from eval_base, weights_dir and steps, or the external API. */
export async function prepareEval(config: EvalConfig): Promise<EvalPlan> {
  const bad = (message: string) => ApplicationFailure.nonRetryable(message, Failure.InvalidConfig);
  const layout = RunLayout.of(config.output_dir, config.run_name);
  if (config.env.length === 0) throw bad('no environments to evaluate: add an [[env]] table');
  checkEnvironments(config.env);
  const versions: EvalVersion[] = [];
  let target: EvalTarget;
  if (config.client.base_url !== undefined) {
    if (!config.model.name) throw bad('an external API (client.base_url) needs model.name: the model the API serves');
    if (config.weights_dir !== undefined)
      throw bad('weights_dir evaluates local weights: it cannot be combined with client.base_url');
    if (config.client.api_key_var !== undefined && process.env[config.client.api_key_var] === undefined) {
      throw bad(`client.api_key_var: environment variable ${config.client.api_key_var} is not set`);
    }
    target = {
      kind: 'api',
      baseUrl: config.client.base_url,
      model: config.model.name,
      apiKeyVar: config.client.api_key_var,
    };
    versions.push({ name: config.model.name, step: null, policyVersion: 0 });
  } else {
    if (!config.model.name) throw bad('model.name: the model folder to evaluate (the base of weights_dir)');
    checkModel(config.model.name);
    target = {
      kind: 'local',
      baseUrls: [`${serverUrl(config.server)}/v1`],
      modelDir: config.model.name,
      client:
        config.server.api_key_var !== undefined
          ? { apiKeyVar: config.server.api_key_var, apiKeySetting: 'server.api_key_var' }
          : undefined,
    };
    if (config.eval_base) versions.push({ name: 'base', step: null, policyVersion: 0 });
    if (config.weights_dir !== undefined) {
      const dir = path.resolve(config.weights_dir);
      if (!fs.existsSync(dir)) throw bad(`weights_dir ${dir} does not exist`);
      const found = listSteps(fs.readdirSync(dir)).filter((s) =>
        fs.existsSync(path.join(dir, `step_${s}`, 'config.json')),
      );
      const missing = (config.steps ?? []).filter((s) => !found.includes(s));
      if (missing.length > 0)
        throw bad(`steps ${missing.join(', ')} not found in ${dir} (it has ${found.join(', ') || 'none'})`);
      for (const s of config.steps ?? found)
        versions.push({ name: `step_${s}`, step: s, policyVersion: s, weightDir: path.join(dir, `step_${s}`) });
    } else if (config.steps !== undefined) throw bad('steps picks folders of weights_dir: set weights_dir');
  }
  if (versions.length === 0) throw bad('nothing to evaluate: eval_base is off and no weights_dir is given');
  fs.mkdirSync(path.join(layout.dir, 'configs'), { recursive: true });
  writeFileAtomic(path.join(layout.dir, 'configs', 'eval.json'), `${JSON.stringify(config, null, 2)}\n`);
  return {
    runDir: layout.dir,
    envs: evalEnvs(config.env),
    numExamples: config.num_examples,
    concurrency: config.concurrency,
    rolloutsPerExample: config.rollouts_per_example,
    sampling: config.sampling,
    seqLen: config.seq_len,
    seed: config.seed,
    target,
    versions,
  };
}

export function createEvalActivities({ pool }: { pool: EnvPool }) {
  return {
    evaluate: (input: EvaluateInput): Promise<EnvEvalMetrics> =>
      storedJson(partFile(input), async () => {
        const { plan, version } = input;
        const env = plan.envs[input.env];
        const info = await environmentInfo(pool, env);
        let n: number;
        try {
          n = evalExampleCount(env.numExamples ?? plan.numExamples, info.size.eval ?? undefined, env.id);
        } catch (e) {
          throw ApplicationFailure.nonRetryable((e as Error).message, Failure.InvalidConfig);
        }
        const k = env.rolloutsPerExample ?? plan.rolloutsPerExample;
        const t = plan.target;
        let client: InferenceClient | undefined;
        const apiKey = t.kind === 'api' && t.apiKeyVar !== undefined ? process.env[t.apiKeyVar] : undefined;
        // Rollouts an interrupted attempt finished are kept: the eval resumes where it stopped.
        const rolloutsFile = partFile(input).replace(/\.json$/, '.rollouts.jsonl');
        const stored = storedRollouts(rolloutsFile);
        fs.mkdirSync(path.dirname(rolloutsFile), { recursive: true });
        const bounds = plan.concurrency ?? DEFAULT_CONCURRENCY;
        // The local server's KV cache and preemptions drive the concurrency; an external API has no such signal.
        const controller = new ConcurrencyController(
          t.kind === 'local' ? bounds : { ...bounds, initial_inflight: fixedLimit(bounds) },
          plan.seqLen,
        );
        let done = [...stored.values()].filter((r) => r.error === undefined).length;
        const errors: string[] = [];
        const tasks = Array.from({ length: n * k }, (_, i) => ({ task: i, example: Math.floor(i / k), sample: i % k }));
        const examples = new Map<number, ReturnType<typeof pool.example>>();
        const results = await withHeartbeat(
          () => ({ version: version.name, env: env.id, done, total: n * k, inflight: controller.limit }),
          async () => {
            if (t.kind === 'local') {
              client = new InferenceClient(t.baseUrls, t.client);
              await client.ensurePolicy({ version: version.policyVersion, weightDir: version.weightDir ?? '' });
            }
            const play = async ({ task, example: index, sample }: (typeof tasks)[number]): Promise<EvalRollout> => {
              // As verifiers' eval resumes: a finished rollout is kept, an errored one played again.
              const kept = stored.get(task);
              if (kept && kept.error === undefined) return kept;
              if (!examples.has(index)) examples.set(index, pool.example(env, 'eval', index, plan.seed));
              const example = await examples.get(index)!;
              const seed = hash32(`eval/${plan.seed}/${index}/${sample}`) & 0x7fffffff;
              let r: { reward: number; completionTokens: number; error?: string };
              if (!example.ok) r = { reward: 0, completionTokens: 0, error: `example: ${example.error}` };
              else if (t.kind === 'local') {
                r = await playRollout(
                  { env, info, example: example.value, seed, seqLen: plan.seqLen, sampling: plan.sampling },
                  pool,
                  client!,
                  tokenizerOf(t.modelDir),
                  {
                    baseUrl: t.baseUrls[(index * k + sample) % t.baseUrls.length],
                    model: verifiersModelName(t.modelDir),
                    renderer: t.renderer,
                    apiKeyVar: t.client?.apiKeyVar,
                    policyVersion: version.policyVersion,
                  },
                );
              } else if (isVerifiersEnv(env.id)) {
                // Its env server calls the API itself, through the token route its renderer
                // client uses (`prime-rl inference`, or prime-rl's vLLM); elsewhere it errors.
                r = await runVerifiersRollout(
                  { env, info, example: example.value, seed, seqLen: plan.seqLen, sampling: plan.sampling },
                  pool.verifiers,
                  {
                    baseUrl: t.baseUrl,
                    model: t.model,
                    renderer: t.renderer,
                    apiKeyVar: t.apiKeyVar,
                    policyVersion: 0,
                  },
                );
              } else {
                r = await runChatRollout({ env, info, example: example.value, seed, sampling: plan.sampling }, pool, {
                  baseUrl: t.baseUrl,
                  model: t.model,
                  apiKey,
                });
              }
              const out: EvalRollout = {
                task,
                reward: r.reward,
                completionTokens: r.completionTokens,
                ...(r.error !== undefined ? { error: r.error } : {}),
              };
              fs.appendFileSync(rolloutsFile, `${JSON.stringify(out)}\n`);
              done++;
              return out;
            };
            return mapAdaptive(tasks, play, {
              controller,
              read: async () => (client ? client.readings() : undefined),
            });
          },
        ).catch((e) => {
          // Our server refusing the eval itself (API key, weight folder) fails it: see client.ts.
          throw toActivityFailure(e);
        });
        for (const r of results) if (r.error) errors.push(r.error);
        if (errors.length === results.length)
          throw ApplicationFailure.nonRetryable(
            `every rollout of ${env.id} on ${version.name} failed, e.g.: ${errors[0]}`,
            Failure.EvalFailed,
          );
        // A failed rollout scores 0, as a wrong answer would.
        const perExample: EvalExample[] = Array.from({ length: n }, (_, e) => ({
          rewards: results.slice(e * k, (e + 1) * k).map((r) => (r.error ? 0 : r.reward)),
          completionTokens: results.slice(e * k, (e + 1) * k).map((r) => r.completionTokens),
        }));
        return summarizeEnvEval(perExample);
      }),

    /** `<runDir>/eval/<version>.json` from the version's per-environment metrics (in plan.envs order). */
    async writeEvalVersion({
      plan,
      version,
      metrics,
    }: {
      plan: EvalPlan;
      version: EvalVersion;
      metrics: EnvEvalMetrics[];
    }): Promise<EvalResults> {
      const keys = envKeys(plan.envs);
      const results: EvalResults = {
        model: version.name,
        step: version.step,
        environments: Object.fromEntries(keys.map((key, i) => [key, metrics[i]])),
      };
      writeEvalResults(plan.runDir, results);
      return results;
    },

    prepareEval,
  };
}

/**
 * Every command's configuration, as zod schemas. This file is the one source of truth: the loader
 * validates against it, `--help` is generated from it, and `--dry-run` prints what it resolves to.
 * Defaults follow the Python prime-rl. Objects are strict: unknown keys are errors.
 */
import { z } from 'zod';
import { LOSS_PARAMS, lossKindSpec, POLICY_LOSSES, type LossParamName } from '../../native/loss-kinds';
import { ARCHS, PROJECTIONS } from '../model/families';
import { ADVANTAGE_TYPES } from '../orchestrator/advantages';
import { DISTILL_BASELINES } from '../orchestrator/distill';
import { isVerifiersEnv } from '../envs/verifiers/environment';
import { outputDirProblem, RUN_NAME_MAX } from './output-dir';
import { serverUrl } from './urls';

export { serverUrl };

/** A config section: strict (unknown keys are errors) and filled from its defaults when absent. */
function section<T extends z.core.$ZodLooseShape>(shape: T) {
  return z.strictObject(shape).prefault({} as never);
}

const positiveInt = () => z.number().int().positive();
const nonNegative = () => z.number().nonnegative();

// ---------------------------------------------------------------------------------------------
// Shared pieces

export const temporalSchema = section({
  address: z.string().optional().describe('host:port of a Temporal server; unset = reuse or start a local dev server'),
  namespace: z.string().default('default').describe('Temporal namespace'),
  ip: z.string().default('127.0.0.1').describe('interface the local dev server binds'),
  port: z.number().int().min(1).max(65535).default(7233).describe('gRPC port of the local dev server'),
  ui_port: z.number().int().min(1).max(65535).default(8233).describe('web UI port of the local dev server'),
  task_queue: z
    .string()
    .regex(/^[A-Za-z0-9._-]+$/)
    .default('prime-rl')
    .describe('task queue prefix: workers poll <prefix>.cpu and <prefix>.trainer'),
  heartbeat_timeout_s: z
    .number()
    .min(5)
    .default(60)
    .describe(
      'silence this long means dead: an activity whose worker sent no heartbeat is retried elsewhere, the launcher restarts a local process that stopped answering, an inference server or teacher that answers nothing (not even /health) has its requests moved',
    ),
});

/** cpu, cuda (the current CUDA device) or cuda:N. */
const deviceSchema = () =>
  z
    .string()
    .regex(/^(cpu|cuda(:\d+)?)$/, "expected 'cpu', 'cuda' or 'cuda:N' (N a device index)")
    .default('cpu')
    .describe('device for the native engine: cpu, cuda or cuda:N');
/** bfloat16 trains in mixed precision: fp32 master weights and optimizer state, bf16 matmuls. */
const computeDtypeSchema = () =>
  z
    .enum(['float32', 'bfloat16'])
    .default('float32')
    .describe('compute dtype; training in bfloat16 keeps fp32 master weights and optimizer state (mixed precision)');

const modelFields = () => ({
  name: z
    .string()
    .min(1)
    .describe(
      'a Hugging Face model folder (made by `prime-rl model create` or trained), or a model name (Org/Name) in the local Hugging Face cache',
    ),
  dtype: computeDtypeSchema(),
  device: deviceSchema(),
});
const modelSchema = () => section(modelFields());
/** The served model (inference): the engine's settings plus how decode steps run. */
const inferenceModelSchema = () =>
  section({
    ...modelFields(),
    enforce_eager: z
      .boolean()
      .default(false)
      .describe(
        'decode every step op by op; false: on CUDA, dense models replay decode steps from CUDA graphs (one per batch and context-length bucket, captured on first use), as vLLM does',
      ),
    paged_attention_kernel: z
      .boolean()
      .default(false)
      .describe(
        "CUDA: decode attention through the engine's own kernel (flash-decoding over the KV blocks in place) instead of libtorch's matmuls over gathered blocks; refused on the CPU and by a build without it",
      ),
  });
/** The trained model (SFT, the RL trainer): the engine's settings plus activation checkpointing and fused kernels. */
const trainerModelSchema = () =>
  section({
    ...modelFields(),
    fused_kernels: z
      .boolean()
      .default(false)
      .describe(
        "run RMSNorm (with the residual add), RoPE, SwiGLU and the LM head's softmax rows as the engine's fused CUDA kernels instead of libtorch's ops (device cuda; off until checked on a card: README, On a GPU machine)",
      ),
    ac: z
      .strictObject({
        freq: positiveInt().default(1).describe('checkpoint every freq-th decoder layer (layers 0, freq, 2 freq, ...)'),
      })
      .optional()
      .describe(
        'activation checkpointing (dense models): checkpointed layers keep only their input and run again in the backward; absent = off',
      ),
  }).superRefine((m, ctx) => {
    if (m.fused_kernels && m.device === 'cpu')
      ctx.addIssue({
        code: 'custom',
        path: ['fused_kernels'],
        message:
          "the fused kernels are CUDA kernels: set the model's device to cuda (or cuda:N), or leave fused_kernels off",
      });
  });

const seqLen = () => positiveInt().default(2048).describe('max tokens of one packed row / one sequence');
const maxSteps = () => positiveInt().optional().describe('number of optimizer steps; unset = no limit');
const outputDir = () =>
  z
    .string()
    .min(1)
    .superRefine((dir, ctx) => {
      const problem = outputDirProblem(dir);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    })
    // prefault: the default goes through the check too.
    .prefault('outputs')
    .describe('root of run folders, checkpoints and the local Temporal database');
const seed = () => z.number().int().nonnegative().default(0).describe('random seed');
const asyncLevel = () =>
  z
    .number()
    .int()
    .nonnegative()
    .default(1)
    .describe('rollouts of step n use policy weights no older than n - async_level');
const runName = (dflt: string) =>
  z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, 'letters, digits, ., _ and - only')
    .max(RUN_NAME_MAX, {
      error: (iss) =>
        `${String(iss.input).length} characters; at most ${RUN_NAME_MAX} (it names a folder of output_dir and a workflow)`,
    })
    .default(dflt)
    .describe('run name: the folder under output_dir and the Temporal workflow id');
const threads = () => positiveInt().optional().describe('compute threads of the native engine; unset = all cores');

/** Mixture-of-experts training options (no effect on dense models). */
const moeTrainShape = {
  router_aux_loss_coef: nonNegative()
    .default(0)
    .describe("weight of the router's load-balancing loss (transformers' definition) added to the loss"),
};
const moeTrainSchema = section(moeTrainShape);
/** RL adds router replay: rollouts carry the experts inference used. */
const moeRlTrainSchema = section({
  ...moeTrainShape,
  router_replay: z
    .boolean()
    .default(false)
    .describe(
      "MoE models only: rollouts keep the experts inference routed each token to, and the trainer sends tokens through them instead of its router's top-k",
    ),
});

const optimizerSchema = section({
  lr: z.number().positive().optional().describe('AdamW learning rate; unset = 1e-6, or 1e-5 with lora.enabled'),
  weight_decay: nonNegative().default(0.01).describe('AdamW decoupled weight decay'),
  betas: z
    .tuple([z.number().min(0).max(1), z.number().min(0).max(1)])
    .default([0.9, 0.999])
    .describe('AdamW betas'),
  eps: z.number().positive().default(1e-8).describe('AdamW epsilon'),
  max_norm: z.number().positive().default(1.0).describe('gradient-norm clipping threshold'),
});

const schedulerSchema = section({
  type: z.enum(['constant', 'linear', 'cosine']).default('constant').describe('learning-rate schedule after warmup'),
  warmup_steps: z.number().int().nonnegative().default(0).describe('linear warmup steps from 0 to lr'),
  min_lr: nonNegative().default(0).describe('final learning rate of the linear and cosine schedules'),
});

const checkpointSchema = section({
  interval: positiveInt().default(50).describe('save a full checkpoint every N steps'),
  keep_last: positiveInt().optional().describe('keep only the newest N checkpoints; unset = keep all'),
  resume_step: z
    .number()
    .int()
    .nonnegative()
    .optional()
    .describe(
      'a new start continues from the checkpoint of this step, redoing (and first discarding) what came after it; unset = continue where the run is',
    ),
});

const envSchema = z
  .strictObject({
    id: z.string().min(1).describe('environment id: a built-in, a module path, or an npm package'),
    args: z.record(z.string(), z.unknown()).default({}).describe('arguments passed to the environment loader'),
    weight: z.number().positive().default(1).describe('sampling weight in the environment mix'),
  })
  .describe('environment');

/** Held-out examples per environment: a count, or -1 for all of them (prime-rl's spelling). */
const evalExamples = () =>
  z
    .number()
    .int()
    .refine((n) => n >= 1 || n === -1, 'a positive count, or -1 for all')
    .describe('held-out examples per environment; -1 = all of them');

/** An eval environment: an environment, optionally with its own size and k. */
const evalEnvSchema = envSchema
  .extend({
    num_examples: evalExamples().optional().describe("this environment's held-out examples; unset = the eval's"),
    rollouts_per_example: positiveInt()
      .optional()
      .describe("this environment's k of avg@k / pass@k; unset = the eval's"),
  })
  .describe('eval environment');

/**
 * The renderer verifiers env servers render and tokenize the policy's chats with (verifiers'
 * `TrainClientConfig.renderer`, a `renderers.RendererConfig`: `name` and that renderer's fields,
 * checked by the env server). Unset: the renderer auto-resolves from the model's name.
 */
const rendererSchema = () =>
  z
    .record(z.string(), z.unknown())
    .refine((r) => typeof r.name === 'string' && r.name !== '', {
      message: 'needs a name: the renderer (renderers package): auto, default, qwen3, prime-qwen3, ...',
    })
    .optional()
    .describe(
      "the renderer verifiers environments' env servers render with (verifiers TrainClientConfig.renderer: name and its fields); unset = resolved from the model's name. Our own environments render with the model's chat template",
    );

const samplingSchema = section({
  temperature: nonNegative().default(1.0).describe('sampling temperature (0 = greedy)'),
  top_p: z.number().gt(0).max(1).default(1.0).describe('nucleus sampling mass'),
  top_k: z.number().int().min(-1).default(-1).describe('keep the k most likely tokens; -1 = off'),
  min_p: z.number().min(0).max(1).default(0).describe('drop tokens below min_p x the top probability'),
  max_tokens: positiveInt().optional().describe('max new tokens per turn; unset = up to seq_len'),
  stop: z
    .array(z.string().min(1))
    .max(16)
    .default([])
    .describe(
      'stop strings: a turn ends at the token that completes one (matched in the decoded text, special tokens left out)',
    ),
});

const loraSchema = section({
  enabled: z.boolean().default(false).describe('train low-rank adapters instead of all weights'),
  rank: positiveInt().default(16).describe('adapter rank'),
  alpha: z.number().positive().default(32).describe('adapter scaling numerator (scale = alpha / rank)'),
  dropout: z.number().min(0).lt(1).default(0).describe('dropout on the adapter input'),
  target_modules: z
    .array(z.enum(PROJECTIONS))
    .min(1)
    .default([...PROJECTIONS])
    .describe('projections that get adapters'),
});

/** One optional key per loss parameter of the native registry, with its range and the kinds that use it. */
const lossParamKeys = Object.fromEntries(
  [...LOSS_PARAMS.values()].map((p) => {
    const n = z.number().min(p.min);
    return [
      p.name,
      (p.max === undefined ? n : n.max(p.max))
        .optional()
        .describe(`${p.doc} (loss ${p.kinds.join(', ')}; default ${p.default})`),
    ];
  }),
) as Record<LossParamName, z.ZodOptional<z.ZodNumber>>;

/**
 * trainer.loss: the policy loss (names and parameters from the native registry, native/loss-kinds)
 * and the corrections every policy loss shares. The chosen type's parameters are filled from
 * their defaults; setting one of another type is an error.
 */
const lossSchema = z
  .strictObject({
    type: z.enum(POLICY_LOSSES).default('dppo').describe('policy loss'),
    ...lossParamKeys,
    normalization: z
      .enum(['token', 'sequence'])
      .default('token')
      .describe('average the loss over all tokens or per sequence'),
    kl_beta: z.number().optional().describe('removed: the KL penalty to the initial model is trainer.kl_penalty'),
    mismatch: section({
      mode: z
        .enum(['none', 'tis', 'mask'])
        .default('none')
        .describe(
          "correction of the trainer/inference mismatch, on each token's policy term (not kl_tau's): tis = times min(ratio, tis_cap), mask = drop the tokens and samples outside the bounds below",
        ),
      tis_cap: z.number().positive().default(2).describe('TIS: cap C on the importance weight'),
      token_low: z.number().positive().default(0.125).describe('mask: drop tokens with ratio below this'),
      token_high: z.number().positive().default(8).describe('mask: drop tokens with ratio above this'),
      seq_low: z
        .number()
        .positive()
        .default(0.1)
        .describe('mask: drop sequences whose geometric-mean ratio is below this'),
      seq_high: z
        .number()
        .positive()
        .default(10)
        .describe('mask: drop sequences whose geometric-mean ratio is above this'),
    }),
  })
  .prefault({})
  .superRefine((l, ctx) => {
    // 0 (off, the old default) passes: run folders written before keep resuming.
    if (l.kl_beta !== undefined && l.kl_beta !== 0)
      ctx.addIssue({
        code: 'custom',
        path: ['kl_beta'],
        message: 'removed: set trainer.kl_penalty (enabled, beta, target_kl) instead',
      });
    const own = lossKindSpec(l.type).params.map((p) => p.name);
    for (const key of LOSS_PARAMS.keys())
      if (l[key] !== undefined && !own.includes(key))
        ctx.addIssue({
          code: 'custom',
          path: [key],
          message: `not a parameter of loss type '${l.type}' (its parameters: ${own.join(', ') || 'none'})`,
        });
  })
  .transform(({ kl_beta: _removed, ...l }) => ({
    ...l,
    ...Object.fromEntries(lossKindSpec(l.type).params.map((p) => [p.name, l[p.name as LossParamName] ?? p.default])),
  }));

/**
 * trainer.kl_penalty: beta * k3 KL to the reference (initial) policy on every loss token. With
 * target_kl, beta adapts after each step by the adaptive controller of Ziegler et al. (2019) with
 * one update per step: beta *= 1 + clip(KL / target_kl - 1, -0.2, 0.2), KL the step's measured
 * mean k3 (lib/trainer/kl-controller.ts). The top-level [kl_penalty] table maps here.
 */
const klPenaltySchema = section({
  enabled: z.boolean().default(false).describe('penalise the KL divergence to the reference (initial) policy'),
  beta: z.number().positive().default(0.001).describe('weight of the KL term (its start value when target_kl is set)'),
  target_kl: z
    .number()
    .positive()
    .optional()
    .describe('adapt beta each step toward this measured KL; unset = fixed beta'),
});

/** What data-parallel trainer ranks shard (native/src/trainer.h `Sharding`). */
export const SHARDINGS = ['optimizer', 'full'] as const;
const SHARDING_HELP =
  "what the ranks shard: 'optimizer' = AdamW's state (ZeRO-1; each rank holds the whole model and its gradients), 'full' = parameters, gradients and AdamW state alike (FSDP)";

/**
 * The data-parallel trainer (lib/trainer/group.ts): `world_size` ranks, one process each, rank 0
 * the Temporal worker serving the c10d TCP store at `dist.host:dist.port` that the other ranks
 * rendezvous through. Shared by `rl` (trainer.*), `sft` (trainer.*) and `worker` (trainer.*, with
 * the rank).
 */
const trainerScaleShape = {
  world_size: positiveInt()
    .default(1)
    .describe('trainer ranks (processes) that train each step together, data parallel; rl and sft start them all'),
  dist: section({
    host: z
      .string()
      .min(1)
      .default('127.0.0.1')
      .describe("rank 0's address: it serves the c10d TCP store there, the other ranks connect to it"),
    port: z
      .number()
      .int()
      .min(0)
      .max(65535)
      .default(0)
      .describe('TCP store port; 0 = rl and sft pick a free one for their local ranks (a worker needs a real port)'),
    timeout_s: z
      .number()
      .positive()
      .default(60)
      .describe('a rank silent this long (joining, a collective) fails the step, which is retried on a fresh group'),
    bucket_mb: z.number().positive().default(25).describe('gradient all-reduce bucket size in MiB'),
    sharding: z.enum(SHARDINGS).default('optimizer').describe(SHARDING_HELP),
    backend: z
      .enum(['auto', 'gloo', 'nccl'])
      .default('auto')
      .describe(
        'what moves CUDA tensors between ranks: auto = NCCL where the native addon has it (PyTorch 2.x with CUDA), else Gloo; CPU tensors always go over Gloo',
      ),
  }),
};

/** `trainer` of `worker`: which rank this process is. */
export const trainerRankSchema = section({
  ...trainerScaleShape,
  rank: z
    .number()
    .int()
    .nonnegative()
    .default(0)
    .describe('this trainer rank: 0 polls the trainer task queue and drives ranks 1..world_size-1'),
}).superRefine((t, ctx) => {
  if (t.rank >= t.world_size)
    ctx.addIssue({
      code: 'custom',
      path: ['rank'],
      message: `must be below trainer.world_size (${t.world_size}): ranks are 0..${t.world_size - 1}`,
    });
  if (t.world_size > 1 && t.dist.port === 0)
    ctx.addIssue({
      code: 'custom',
      path: ['dist', 'port'],
      message: 'every rank must know the TCP store port of rank 0: set the same trainer.dist.port on all ranks',
    });
});
export type TrainerRankConfig = z.output<typeof trainerRankSchema>;

/** The lr default depends on LoRA (as prime-rl: 1e-6 full, 1e-5 LoRA), so it is filled after parsing. */
function withLrDefault<T extends { optim: { lr?: number }; lora: { enabled: boolean } }>(c: T) {
  return { ...c, optim: { ...c.optim, lr: c.optim.lr ?? (c.lora.enabled ? 1e-5 : 1e-6) } };
}

// ---------------------------------------------------------------------------------------------
// Components of an RL run

export const trainerSchema = z
  .strictObject({
    model: trainerModelSchema(),
    seq_len: seqLen(),
    max_steps: maxSteps(),
    output_dir: outputDir(),
    seed: seed(),
    threads: threads(),
    optim: optimizerSchema,
    scheduler: schedulerSchema,
    loss: lossSchema,
    kl_penalty: klPenaltySchema,
    lora: loraSchema,
    moe: moeRlTrainSchema,
    ...trainerScaleShape,
  })
  .prefault({})
  .transform(withLrDefault);

/** A plugin module (lib/orchestrator/plugins.ts): `import_path` + `kwargs`. */
const pluginSchema = (what: string, contract: string) =>
  z.strictObject({
    import_path: z
      .string()
      .min(1)
      .describe(
        `${what} module: ./file.ts (relative to the working directory), an absolute path or an npm package; ${contract}`,
      ),
    kwargs: z.record(z.string(), z.unknown()).default({}).describe(`keyword arguments passed to the ${what}`),
  });

/** `orchestrator.advantage`: a built-in estimator (type + options) or a plugin (import_path + kwargs). */
const advantageSchema = z
  .strictObject({
    type: z
      .enum(ADVANTAGE_TYPES)
      .optional()
      .describe(
        'built-in estimator: grpo (R - mean), rloo (leave-one-out), opo (length-weighted baseline), max_rl ((R - mean) / mean); unset = grpo unless import_path is set',
      ),
    std_norm: z
      .boolean()
      .default(false)
      .describe('built-ins: divide advantages by the group reward std (not with max_rl)'),
    length_penalty: z
      .strictObject({
        type: z.literal('linear').default('linear').describe('the penalty: linear'),
        num_output_tokens_weight: nonNegative().default(0.25).describe('weight of generated tokens / the group max'),
        num_input_tokens_weight: nonNegative()
          .default(0.1)
          .describe('weight of read tokens (prompt, env turns) / the group max'),
        num_turns_weight: nonNegative().default(0.1).describe('weight of turns / the group max'),
      })
      .optional()
      .describe(
        'built-ins: subtract mean(R) x the weighted length terms from each reward before the estimator; unset = off',
      ),
    import_path: z
      .string()
      .min(1)
      .optional()
      .describe(
        'plugin estimator module (./my_adv.ts relative to the working directory, an absolute path or an npm package); its `advantage` or default export: (group, kwargs) => advantages',
      ),
    kwargs: z.record(z.string(), z.unknown()).default({}).describe('keyword arguments passed to the plugin estimator'),
  })
  .superRefine((a, ctx) => {
    if (a.import_path !== undefined) {
      for (const k of ['type', 'length_penalty'] as const) {
        if (a[k] !== undefined)
          ctx.addIssue({
            code: 'custom',
            path: [k],
            message: `set either ${k} (a built-in) or import_path (a plugin estimator, which computes the advantages itself), not both`,
          });
      }
      if (a.std_norm)
        ctx.addIssue({
          code: 'custom',
          path: ['std_norm'],
          message: 'std_norm applies to built-in estimators only; a plugin (import_path) normalises itself',
        });
    } else if (Object.keys(a.kwargs).length > 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['kwargs'],
        message:
          'kwargs are passed to a plugin estimator: set import_path, or configure a built-in with type, std_norm and length_penalty',
      });
    }
    if (a.type === 'max_rl' && a.std_norm) {
      ctx.addIssue({
        code: 'custom',
        path: ['std_norm'],
        message: 'max_rl normalises by the group mean: std_norm must stay false',
      });
    }
  })
  .prefault({})
  // The built-in default, filled here so that --dry-run shows what runs.
  .transform((a) => (a.import_path === undefined ? { ...a, type: a.type ?? 'grpo' } : a));

export const orchestratorSchema = section({
  model: modelSchema(),
  seq_len: seqLen(),
  max_steps: maxSteps(),
  async_level: asyncLevel(),
  output_dir: outputDir(),
  seed: seed(),
  batch_size: positiveInt().default(128).describe('rollouts per step'),
  rollouts_per_example: positiveInt()
    .default(8)
    .describe('rollouts per prompt (the group size of the advantage baseline)'),
  sampling: samplingSchema,
  advantage: advantageSchema,
  difficulty_filter: section({
    enabled: z
      .boolean()
      .default(false)
      .describe('drop groups outside the filter and refill the step with fresh examples'),
    min_reward_variance: nonNegative()
      .default(0)
      .describe(
        'drop groups whose reward variance (population) is below this; groups of equal rewards are always dropped when enabled',
      ),
    min_reward: z.number().optional().describe('drop groups whose mean reward is below this'),
    max_reward: z.number().optional().describe('drop groups whose mean reward is above this'),
  }),
  rollout_filters: z
    .array(
      pluginSchema(
        'rollout filter',
        '`filter` or default export: (group, kwargs) => true to keep, false or a reason to drop',
      ),
    )
    .default([])
    .describe('plugin filters, applied after difficulty_filter; dropped groups are refilled the same way'),
  max_refill_rounds: z
    .number()
    .int()
    .nonnegative()
    .default(4)
    .describe(
      'rounds of fresh examples a step may play to replace the groups its filters dropped; then it trains on what it has',
    ),
  in_flight: section({
    enabled: z
      .boolean()
      .default(false)
      .describe(
        'in-flight mode: rollouts are generated continuously and the inference servers take each new policy as soon as the trainer writes it ' +
          '(between two decode steps); a step trains the next batch_size finished rollouts. Off (strict mode): rollouts of step n use ' +
          'policy n - async_level exactly, so a run is reproducible',
      ),
    max_off_policy_steps: z
      .number()
      .int()
      .nonnegative()
      .default(8)
      .describe(
        'in-flight mode: a group whose oldest token is more than this many policy versions behind the step that would train it is dropped (and counted)',
      ),
    max_rollouts: positiveInt()
      .optional()
      .describe(
        'in-flight mode: cap on rollouts generated ahead of the steps (in flight, finished and not yet taken by a step, or left over by keep_mix); below it, concurrency adapts to keep up with the steps within what the servers take (README, in-flight mode). Unset = 2 x batch_size',
      ),
    keep_mix: z
      .boolean()
      .default(false)
      .describe(
        "in-flight mode: each [[env]] entry gets strict mode's share of every step; a group beyond its env's share is left for the next step " +
          '(at most one step of groups left over; past that it is taken). Off: a step takes the groups in the order they finish, which favours envs with short rollouts',
      ),
  }),
  filter_zero_advantages: z
    .boolean()
    .default(true)
    .describe('do not train on rollouts whose advantage is exactly 0 (no policy-gradient signal)'),
  // The old filter section, kept so that its keys (in a file or on the command line) get this
  // error instead of "unknown key".
  filter: z
    .strictObject({
      zero_variance: z.unknown().optional().describe('removed: see orchestrator.difficulty_filter'),
      min_reward: z.unknown().optional().describe('removed: see orchestrator.difficulty_filter.min_reward'),
      max_reward: z.unknown().optional().describe('removed: see orchestrator.difficulty_filter.max_reward'),
    })
    .optional()
    .refine((v) => v === undefined, {
      message:
        'replaced by orchestrator.difficulty_filter { enabled, min_reward_variance, min_reward, max_reward }, which refills the groups it drops ' +
        '(zero_variance = true is enabled = true; zero_variance = false is the default, enabled = false) and orchestrator.filter_zero_advantages',
    })
    .describe('removed: see orchestrator.difficulty_filter'),
  renderer: rendererSchema(),
  env_workers: positiveInt().default(2).describe('child processes that run environment code'),
  env_timeout_s: z.number().positive().default(60).describe('seconds before an environment call counts as hung'),
  base_urls: z
    .array(z.string().url())
    .min(1)
    .optional()
    .describe(
      "inference servers to spread rollouts over (http://host:port/v1 each); unset = the run's own server, " +
        'http://<inference.server.host>:<inference.server.port>/v1, so changing that port moves both. Set it for ' +
        'servers started elsewhere (`worker --pool inference`); then it wins, and inference.server.api_key_var, ' +
        'max_running and max_queued still say how the orchestrator talks to them',
    ),
});

export const serverSchema = z
  .strictObject({
    host: z.string().default('127.0.0.1').describe('interface the HTTP server binds'),
    port: z.number().int().min(0).max(65535).default(8000).describe('HTTP port (0 = any free port)'),
    api_key_var: z
      .string()
      .min(1)
      .optional()
      .describe(
        'environment variable holding the bearer token clients must send (in rl, the orchestrator sends it too: set it for the cpu workers as well)',
      ),
    headers_timeout_s: z
      .number()
      .positive()
      .default(30)
      .describe('a client that has not sent its request headers after this long is disconnected (408)'),
    request_timeout_s: z
      .number()
      .positive()
      .default(300)
      .describe(
        'a client that has not sent its whole request (headers and body) after this long is disconnected (408)',
      ),
    prompt_timeout_s: z
      .number()
      .positive()
      .default(30)
      .describe(
        "longest the model's chat template may render, and its tokenizer tokenize, one request's prompt (in a helper process); beyond it the helper is stopped and the request gets a 400 naming the template",
      ),
    max_response_entries: positiveInt()
      .default(1 << 20)
      .describe(
        'largest non-streamed completion one request may ask for, in entries: n x max_tokens x (1 + top logprobs) on /v1/chat/completions, prompts x n x (max_tokens x (1 + logprobs) + echoed prompt tokens) on /v1/completions; more is a 400 naming the fields (a stream is not bounded)',
      ),
    prompt_heap_mb: positiveInt()
      .default(1024)
      .describe(
        'heap of each helper process that renders chat templates and tokenizes prompts, in MiB; a template or tokenizer that needs more is stopped and the request gets a 400 naming it',
      ),
  })
  .superRefine((c, ctx) => {
    if (c.request_timeout_s < c.headers_timeout_s) {
      ctx.addIssue({
        code: 'custom',
        path: ['request_timeout_s'],
        message: `must be at least headers_timeout_s (${c.headers_timeout_s}): the request includes its headers`,
      });
    }
  })
  .prefault({});

export const inferenceSchema = z
  .strictObject({
    model: inferenceModelSchema(),
    seq_len: seqLen(),
    output_dir: outputDir(),
    seed: seed(),
    threads: threads(),
    server: serverSchema,
    max_running: positiveInt().default(64).describe('max sequences decoded together'),
    max_queued: positiveInt()
      .default(1024)
      .describe(
        'max sequences waiting for a slot before new requests get 429 (in rl, the orchestrator keeps at most max_running + max_queued requests in flight per server, and retries a 429 with backoff)',
      ),
    kv_cache_tokens: positiveInt()
      .optional()
      .describe(
        'the paged KV cache in token positions (rounded up to whole blocks), at least seq_len; unset = gpu_memory_utilization on CUDA when set, else max_running x seq_len',
      ),
    gpu_memory_utilization: z
      .number()
      .gt(0)
      .lte(1)
      .optional()
      .describe(
        "CUDA, instead of kv_cache_tokens: the share of the device's memory the server uses at most (weights, a step's activations, then the KV cache), as vLLM's",
      ),
    block_size: positiveInt().max(1024).default(16).describe('token positions per KV-cache block'),
    prefix_sharing: z
      .enum(['cache', 'live', 'off'])
      .default('cache')
      .describe(
        "sequences with a common token prefix (a request's n completions, a group's rollouts, a multi-turn rollout's next turn) share its KV blocks, prefilled once: cache = also prefixes of finished sequences, kept until their blocks are needed (LRU); live = only sequences running together; off = none. A weight update invalidates cached prefixes",
      ),
    max_batched_tokens: positiveInt()
      .default(2048)
      .describe(
        'tokens one engine step computes, at least max_running: a decode row per running sequence, then chunks of the prompts being prefilled (a long prompt never stalls the running sequences)',
      ),
    decode_steps: positiveInt()
      .max(64)
      .default(1)
      .describe(
        'decode steps per round trip to the host while nothing waits or prefills (tokens fed back on the device); a sequence ended by a stop string may compute up to decode_steps - 1 dropped tokens',
      ),
    allowed_weight_roots: z
      .array(z.string())
      .optional()
      .describe('folders update_weights may load from; unset = output_dir'),
    replicas: positiveInt()
      .default(1)
      .describe(
        "rl: the inference servers `prime-rl rl` starts, each the whole model, on ports server.port, server.port + 1, ... (prime-rl's vllm.data_parallel_size); `inference` and `worker --pool inference` run one",
      ),
    cpu_cache_mb: z
      .number()
      .int()
      .nonnegative()
      .default(512)
      .describe(
        'freed large CPU tensors the engine keeps for reuse, in MiB (0 = none): decode reuses its buffers, and requests of many shapes fill the cache up to this bound, which stays resident',
      ),
  })
  .superRefine((c, ctx) => {
    // Below seq_len, a long request could never run even alone.
    if (c.kv_cache_tokens !== undefined && c.kv_cache_tokens < c.seq_len) {
      ctx.addIssue({
        code: 'custom',
        path: ['kv_cache_tokens'],
        message: `${c.kv_cache_tokens} is smaller than seq_len (${c.seq_len}): one full-length sequence would not fit; raise kv_cache_tokens or lower seq_len`,
      });
    }
    if (c.gpu_memory_utilization !== undefined && (c.kv_cache_tokens !== undefined || c.model.device === 'cpu')) {
      ctx.addIssue({
        code: 'custom',
        path: ['gpu_memory_utilization'],
        message:
          c.model.device === 'cpu'
            ? 'sizes the KV cache of a CUDA device, and model.device is cpu: set kv_cache_tokens instead'
            : 'set either gpu_memory_utilization or kv_cache_tokens, not both',
      });
    }
    if (c.model.paged_attention_kernel && c.model.device === 'cpu') {
      ctx.addIssue({
        code: 'custom',
        path: ['model', 'paged_attention_kernel'],
        message: 'is a CUDA kernel, and model.device is cpu',
      });
    }
    if (c.max_batched_tokens < c.max_running) {
      ctx.addIssue({
        code: 'custom',
        path: ['max_batched_tokens'],
        message: `${c.max_batched_tokens} is smaller than max_running (${c.max_running}): every running sequence decodes in each step`,
      });
    }
  })
  .prefault({});

const evalShape = {
  interval: positiveInt().optional().describe('run an eval every N steps (and at the end); unset = off'),
  num_examples: evalExamples().default(32),
  rollouts_per_example: positiveInt().default(1).describe('k of avg@k / pass@k'),
  sampling: samplingSchema,
};
const evalSettings = section({
  ...evalShape,
  env: z.array(evalEnvSchema).default([]).describe('eval environments; empty = the training environments'),
});

/** The servers of `inference.replicas`: the configured one, then the next ports. */
export function replicaServers<S extends { port: number }>(inference: { server: S; replicas: number }): S[] {
  return Array.from({ length: inference.replicas }, (_, i) => ({
    ...inference.server,
    port: inference.server.port + i,
  }));
}

/** Keys of `rl` that fill the trainer, orchestrator and inference sections (as prime-rl's `rl` command shares them). */
export const RL_SHARED_KEYS = ['model.name', 'seq_len', 'max_steps', 'async_level', 'output_dir', 'seed'] as const;
export const RL_SECTIONS = ['trainer', 'orchestrator', 'inference'] as const;
/** The inference server may hold longer sequences than the run makes (prime-rl's vLLM max_model_len). */
export const RL_SHARED_AT_LEAST = { seq_len: ['inference'] } as const;

/**
 * max_tokens must leave room for a prompt: every prompt has at least one token, and prompt plus
 * completion must fit in seq_len, so a max_tokens of seq_len or more can never be honoured.
 */
function checkMaxTokens(
  ctx: z.core.$RefinementCtx,
  at: string[],
  maxTokens: number | undefined,
  seqLen: number,
  seqLenKey: string,
): void {
  if (maxTokens === undefined || maxTokens < seqLen) return;
  ctx.addIssue({
    code: 'custom',
    path: at,
    message: `${maxTokens} leaves no room for the prompt within ${seqLenKey} (${seqLen}): prompt + completion must fit in ${seqLenKey}; lower max_tokens below ${seqLen} or raise ${seqLenKey}`,
  });
}

export const rlSchema = z
  .strictObject({
    run_name: runName('rl'),
    model: section({
      name: z.string().min(1).optional().describe('model folder for trainer, orchestrator and inference'),
    }),
    seq_len: seqLen(),
    max_steps: maxSteps(),
    async_level: asyncLevel(),
    output_dir: outputDir(),
    seed: seed(),
    env: z.array(envSchema).default([]).describe('training environments: [[env]] id, args, weight'),
    ckpt: checkpointSchema,
    eval: evalSettings,
    temporal: temporalSchema,
    // Present (a [wandb] table, any --wandb.* flag or PRIME_WANDB__* variable) = W&B logging on, as
    // in prime-rl; absent = off. `prime-rl rl` alone starts it (lib/launch/rl.ts).
    wandb: z
      .strictObject({
        project: z
          .string()
          .min(1)
          .default('prime-rl')
          .describe(
            "Weights & Biases project. A [wandb] table (even empty) or any --wandb.* flag logs every step's metrics to W&B (needs WANDB_API_KEY, or WANDB_MODE=offline for a local run folder); no [wandb] = no W&B",
          ),
        name: z.string().min(1).optional().describe('W&B run name; unset = run_name'),
        entity: z.string().min(1).optional().describe("W&B team or user; unset = the API key's default"),
      })
      .optional(),
    distill: section({
      teacher: z
        .strictObject({
          base_url: z
            .string()
            .url()
            .describe(
              "the OpenAI-compatible server serving the teacher (http://host:port/v1): `prime-rl inference`, or any server whose /completions returns the prompt tokens' logprobs with echo and logprobs (vLLM)",
            ),
          model: z
            .string()
            .min(1)
            .describe("the teacher's model folder: its tokenizer must be the student's (checked when the run starts)"),
          served_model: z
            .string()
            .min(1)
            .optional()
            .describe(
              "the teacher's name on its server, sent as the requests' `model`; unset = the one model GET base_url/models lists (an error naming this key when it lists several)",
            ),
          api_key_var: z
            .string()
            .min(1)
            .optional()
            .describe(
              "environment variable holding the teacher's API key, sent as a bearer token (set it for the cpu workers); unset = no key",
            ),
        })
        .optional()
        .describe(
          "online distillation from a teacher: each generated token's advantage is the teacher's logprob of it minus the student's (reverse KL), plus weight x the environment's advantage; unset = off",
        ),
      weight: nonNegative()
        .default(0)
        .describe(
          'distillation: weight of the environment-reward advantage added to the teacher term (0 = pure distillation)',
        ),
      baseline: z
        .enum(DISTILL_BASELINES)
        .default('none')
        .describe(
          "distillation: subtracted from each token's teacher term, keeping its expected gradient: none, or position (the mean term of the other rollouts of its group at the same generated position, leave-one-out)",
        ),
    }),
    trainer: trainerSchema,
    orchestrator: orchestratorSchema,
    inference: inferenceSchema,
  })
  .superRefine((c, ctx) => {
    // Checked here, once, so the CLI refuses such a config (exit 2) and a run started with it from
    // elsewhere (`temporal workflow start`) fails when its stored config is read (readRunConfig).
    const o = c.orchestrator;
    if (o.batch_size % o.rollouts_per_example !== 0) {
      const lower = o.batch_size - (o.batch_size % o.rollouts_per_example);
      const options = [lower, lower + o.rollouts_per_example].filter((n) => n > 0).join(' or ');
      ctx.addIssue({
        code: 'custom',
        path: ['orchestrator', 'batch_size'],
        message: `${o.batch_size} is not a multiple of orchestrator.rollouts_per_example (${o.rollouts_per_example}): a step samples batch_size / rollouts_per_example examples, each rollouts_per_example times; use e.g. ${options}`,
      });
    }
    checkMaxTokens(
      ctx,
      ['orchestrator', 'sampling', 'max_tokens'],
      o.sampling.max_tokens,
      o.seq_len,
      'orchestrator.seq_len',
    );
    // Evals sample from the same inference server, within the orchestrator's seq_len.
    checkMaxTokens(
      ctx,
      ['eval', 'sampling', 'max_tokens'],
      c.eval.sampling.max_tokens,
      o.seq_len,
      'orchestrator.seq_len',
    );
    if (o.in_flight.enabled && c.eval.interval !== undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['eval', 'interval'],
        message:
          'evals between steps are not supported with orchestrator.in_flight.enabled (rollouts are generated continuously on the same servers): unset eval.interval, or run `prime-rl eval` on the weights afterwards',
      });
    }
    if (o.renderer !== undefined && ![...c.env, ...c.eval.env].some((e) => isVerifiersEnv(e.id)))
      ctx.addIssue({
        code: 'custom',
        path: ['orchestrator', 'renderer'],
        message:
          "is the renderer of verifiers environments' env servers, and this run has none: our own environments render with the model's chat template. Remove it, or train on a verifiers environment",
      });
    if (
      o.in_flight.enabled &&
      o.in_flight.max_rollouts !== undefined &&
      o.in_flight.max_rollouts < o.rollouts_per_example
    ) {
      ctx.addIssue({
        code: 'custom',
        path: ['orchestrator', 'in_flight', 'max_rollouts'],
        message: `${o.in_flight.max_rollouts} is below orchestrator.rollouts_per_example (${o.rollouts_per_example}): the cap must hold at least one group`,
      });
    }
    if (c.inference.replicas > 1 && c.inference.server.port === 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['inference', 'server', 'port'],
        message: `port 0 (any free port) leaves inference.replicas (${c.inference.replicas}) no ports to follow: choose a port`,
      });
    }
    if (c.orchestrator.base_urls === undefined && c.inference.server.port === 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['inference', 'server', 'port'],
        message:
          "port 0 (any free port) leaves the orchestrator no address for the run's inference server: choose a port, or set orchestrator.base_urls",
      });
    }
  })
  // Resolved here, so that --dry-run prints (and the workflow gets) the address that is used.
  .transform((c) => ({
    ...c,
    orchestrator: {
      ...c.orchestrator,
      base_urls: c.orchestrator.base_urls ?? replicaServers(c.inference).map((server) => `${serverUrl(server)}/v1`),
    },
  }));

// ---------------------------------------------------------------------------------------------
// Other commands

export const sftSchema = z
  .strictObject({
    run_name: runName('sft'),
    model: trainerModelSchema(),
    seq_len: seqLen(),
    max_steps: maxSteps(),
    epochs: positiveInt().default(1).describe('passes over the dataset (max_steps wins when both are set)'),
    output_dir: outputDir(),
    seed: seed(),
    batch_size: positiveInt()
      .default(32)
      .describe('samples per optimizer step (packed into rows of seq_len; one row per forward/backward)'),
    threads: threads(),
    data: section({
      path: z.string().optional().describe('JSONL dataset (prompt/completion or messages rows)'),
      name: z
        .string()
        .min(1)
        .optional()
        .describe(
          'a Hugging Face dataset: its name (Org/Name) in the local Hugging Face cache, or a folder laid out as on the Hub (parquet or JSONL files, split by file name); rows of prompt/completion or messages',
        ),
      split: z.string().min(1).default('train').describe("data.name's split, by file name as the Hub lays it out"),
      env: envSchema.optional().describe('generate the dataset from an environment instead of a file'),
      num_examples: positiveInt().optional().describe('examples to take; unset = all'),
      loss_roles: z.array(z.string()).default(['assistant']).describe('message roles whose tokens carry loss'),
    }),
    val: section({
      path: z.string().optional().describe('JSONL validation set; unset = the eval split of data.env'),
      name: z.string().min(1).optional().describe('a Hugging Face dataset as validation set (as data.name)'),
      split: z.string().min(1).default('validation').describe("val.name's split"),
      num_examples: positiveInt()
        .optional()
        .describe('validation examples; unset = all rows of val.path, or 64 examples of data.env'),
      interval: positiveInt().optional().describe('validation loss every N steps (and at the end); unset = off'),
      target_loss: z
        .number()
        .positive()
        .optional()
        .describe(
          'stop once the validation loss is at or below this (checkpoint and weights of that step); needs val.interval',
        ),
    }),
    optim: optimizerSchema,
    scheduler: schedulerSchema,
    lora: loraSchema,
    moe: moeTrainSchema,
    ckpt: checkpointSchema,
    eval: section({
      ...evalShape,
      interval: positiveInt()
        .optional()
        .describe(
          'evaluate the SFT weights on eval.env every N steps (the base model first, and the end); unset = off',
        ),
      env: z.array(evalEnvSchema).default([]).describe('eval environments (required with eval.interval)'),
      renderer: rendererSchema(),
    }),
    inference: section({
      server: serverSchema.describe('the inference server the evals sample from (started when eval.interval is set)'),
    }),
    temporal: temporalSchema,
    trainer: section(trainerScaleShape),
  })
  .superRefine((c, ctx) => {
    const sources = (['path', 'name', 'env'] as const).filter((k) => c.data[k] !== undefined);
    if (sources.length > 1)
      ctx.addIssue({
        code: 'custom',
        path: ['data', sources[1]],
        message: `give one dataset: data.${sources.join(' and data.')} are both set`,
      });
    if (c.val.path !== undefined && c.val.name !== undefined)
      ctx.addIssue({
        code: 'custom',
        path: ['val', 'name'],
        message: 'give one validation set: val.path and val.name are both set',
      });
    if (c.eval.interval !== undefined && c.eval.env.length === 0)
      ctx.addIssue({
        code: 'custom',
        path: ['eval', 'env'],
        message: 'eval.interval evaluates environments: add [[eval.env]] entries (prime-rl: [[eval.source]])',
      });
    if (c.eval.interval !== undefined)
      checkMaxTokens(ctx, ['eval', 'sampling', 'max_tokens'], c.eval.sampling.max_tokens, c.seq_len, 'seq_len');
    if (c.eval.renderer !== undefined && !c.eval.env.some((e) => isVerifiersEnv(e.id)))
      ctx.addIssue({
        code: 'custom',
        path: ['eval', 'renderer'],
        message:
          "is the renderer of verifiers environments' env servers, and the evals have none: our own environments render with the model's chat template",
      });
    if (c.val.target_loss !== undefined && c.val.interval === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['val', 'target_loss'],
        message: 'needs val.interval: the validation loss it is compared with is measured every val.interval steps',
      });
    }
  })
  .transform(withLrDefault);

export const evalSchema = z
  .strictObject({
    run_name: runName('eval'),
    model: section({
      name: z.string().min(1).optional().describe('model folder, or the model name an external API expects'),
      dtype: computeDtypeSchema(),
      device: deviceSchema(),
    }),
    seq_len: seqLen(),
    output_dir: outputDir(),
    seed: seed(),
    env: z.array(evalEnvSchema).default([]).describe('environments to evaluate'),
    num_examples: evalExamples().default(32),
    rollouts_per_example: positiveInt().default(1).describe('k of avg@k / pass@k'),
    sampling: samplingSchema,
    weights_dir: z.string().optional().describe('evaluate every step_N folder in this directory'),
    steps: z.array(z.number().int().nonnegative()).optional().describe('only these steps of weights_dir'),
    eval_base: z.boolean().default(true).describe('also evaluate the base model'),
    client: section({
      base_url: z.string().url().optional().describe('external OpenAI-compatible API instead of a local server'),
      api_key_var: z.string().optional().describe('environment variable holding its API key'),
    }),
    server: serverSchema.describe('the local inference server the eval starts (unless client.base_url)'),
    threads: threads(),
    temporal: temporalSchema,
  })
  .superRefine((c, ctx) => {
    // An external API (client.base_url) has its own context length; seq_len is that of the local server.
    if (c.client.base_url === undefined)
      checkMaxTokens(ctx, ['sampling', 'max_tokens'], c.sampling.max_tokens, c.seq_len, 'seq_len');
  });

/** Keys of `worker` that also fill its `inference` section (the server follows --output-dir). */
export const WORKER_SHARED_KEYS = ['output_dir', 'threads'] as const;
export const WORKER_SECTIONS = ['inference'] as const;

export const workerSchema = z.strictObject({
  pool: z
    .enum(['cpu', 'trainer', 'inference'])
    .describe('cpu and trainer poll their task queues; inference serves HTTP'),
  output_dir: outputDir(),
  threads: threads(),
  env_workers: positiveInt().default(2).describe('cpu pool: child processes that run environment code'),
  env_timeout_s: z
    .number()
    .positive()
    .default(60)
    .describe('cpu pool: seconds before an environment call counts as hung'),
  temporal: temporalSchema,
  inference: inferenceSchema.optional().describe('inference pool: the server to run'),
  trainer: trainerRankSchema.describe('trainer pool: this rank of the data-parallel trainer'),
});

export const modelCreateSchema = z.strictObject({
  arch: z.enum(ARCHS).default('qwen3').describe('architecture'),
  preset: z.enum(['tiny', 'small']).default('tiny').describe('size preset; explicit sizes below override it'),
  tokenizer: z.enum(['bytes', 'qwen3']).default('bytes').describe('byte-level tokenizer, or the real Qwen3 one'),
  seed: seed(),
  out: z.string().min(1).describe('folder to write'),
  dtype: z.enum(['float32', 'bfloat16']).default('float32').describe('dtype of the saved weights'),
  hidden_size: positiveInt().optional().describe('model width'),
  intermediate_size: positiveInt().optional().describe('MLP width'),
  num_layers: positiveInt().optional().describe('decoder blocks'),
  num_heads: positiveInt().optional().describe('attention heads'),
  num_kv_heads: positiveInt().optional().describe('key/value heads (GQA)'),
  head_dim: positiveInt().optional().describe('per-head width; unset = hidden_size / num_heads'),
  max_position_embeddings: positiveInt().optional().describe('context length'),
  rope_theta: z.number().positive().optional().describe('RoPE base'),
  tie_word_embeddings: z.boolean().optional().describe('share embedding and output weights'),
  // Mixture of experts (qwen3_moe only); unset = the preset's.
  num_experts: positiveInt().optional().describe('qwen3_moe: experts per sparse block'),
  num_experts_per_tok: positiveInt().optional().describe('qwen3_moe: experts each token is routed to (top-k)'),
  moe_intermediate_size: positiveInt().optional().describe('qwen3_moe: width of each expert MLP'),
  decoder_sparse_step: positiveInt().optional().describe('qwen3_moe: block l is sparse when (l + 1) % step == 0'),
  mlp_only_layers: z.array(z.number().int().nonnegative()).optional().describe('qwen3_moe: blocks kept dense'),
  norm_topk_prob: z.boolean().optional().describe('qwen3_moe: renormalise the top-k routing weights to sum to 1'),
});

/** `prime-rl model plan`: the memory a training rank needs (lib/trainer/plan.ts). */
export const modelPlanSchema = z.strictObject({
  model: z
    .string()
    .min(1)
    .describe('a Hugging Face model folder (its config.json is read) or a preset: qwen3-8b, qwen3-32b'),
  world_size: positiveInt().default(1).describe('trainer ranks (one per device)'),
  sharding: z.enum(SHARDINGS).optional().describe(`${SHARDING_HELP}; unset = both, side by side`),
  seq_len: positiveInt().default(4096).describe('tokens of one packed row (rows train one at a time)'),
  ac: z.boolean().default(false).describe('activation checkpointing of every decoder layer ([trainer.model.ac])'),
  dtype: z
    .enum(['bfloat16', 'float32'])
    .default('bfloat16')
    .describe('compute dtype: bfloat16 = mixed precision over fp32 master weights (GPU), float32 = fp32 throughout'),
  lora_rank: z
    .number()
    .int()
    .nonnegative()
    .default(0)
    .describe('LoRA rank with adapters on every projection; 0 = full fine-tuning'),
  device_memory_gib: z.number().positive().default(80).describe('memory of one device, for the longest row that fits'),
});

export const reportSchema = z.strictObject({
  run: z
    .string()
    .min(1)
    .describe('run name (a folder of output_dir) or a run folder path; also accepted as the first argument'),
  output_dir: outputDir(),
});

/** The run folder a report names: an existing path as given, else `<output_dir>/<run>`. */
export function reportRunDir(c: z.output<typeof reportSchema>): string {
  return c.run.includes('/') ? c.run : `${c.output_dir}/${c.run}`;
}

export const temporalCommandSchema = z.strictObject({
  output_dir: outputDir(),
  temporal: temporalSchema,
});

export type RLConfig = z.output<typeof rlSchema>;
export type TrainerConfig = z.output<typeof trainerSchema>;
export type OrchestratorConfig = z.output<typeof orchestratorSchema>;
export type InferenceConfig = z.output<typeof inferenceSchema>;
export type SFTConfig = z.output<typeof sftSchema>;
export type EvalConfig = z.output<typeof evalSchema>;
export type WorkerConfig = z.output<typeof workerSchema>;
export type ModelCreateConfig = z.output<typeof modelCreateSchema>;
export type ModelPlanConfig = z.output<typeof modelPlanSchema>;
export type TemporalConfig = z.output<typeof temporalSchema>;
export type TemporalCommandConfig = z.output<typeof temporalCommandSchema>;

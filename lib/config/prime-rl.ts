/**
 * The config classes prime-rl uses today (its `prime_rl.configs` package: `rl`, `sft`, and the
 * `evals` config, and the examples under its examples/basic/), as alias tables onto our keys
 * (aliases.ts applies them). Every key prime-rl has there is in a table: mapped onto ours, accepted
 * with nothing to set (a note says why it changes nothing here), or refused with the reason. Both
 * spellings prime-rl has used are accepted: `[[orchestrator.train.source]]` / `[[orchestrator.train.env]]`,
 * `[monitors.wandb]` / `[wandb]`, and on a source `env.taskset` + `env.<agent>.harness` /
 * `env.<agent>.runtime` or `taskset` + `harness` (runtime inside it) directly on the entry.
 *
 * A source's `env.taskset.id` is a verifiers taskset: it becomes a `verifiers:<id>` environment,
 * resolved by verifiers itself (lib/envs/verifiers/), with the source's other `env` fields (its
 * agents, whatever they are called) as the env server's config.
 */
import type { Alias, ConvertAt, Converted } from './aliases';
import { get, refusal } from './aliases';
import { ConfigError } from '../failures';
import { algoConverted } from './prime-rl-algo';

type Raw = Record<string, unknown>;
const isTable = (v: unknown): v is Raw => typeof v === 'object' && v !== null && !Array.isArray(v);
const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
const shown = (v: unknown) => JSON.stringify(v);

/** Accepted, with nothing of ours to set: the note says why that changes nothing here. */
const accept = (from: string, note: string, table = false): Alias => ({ from, to: null, note, table });
/** No equivalent here: an error naming the key and why (every key of it, for a table). */
const refuse = (from: string, reason: string, table = false): Alias => ({ from, to: null, refuse: reason, table });
/** A feature prime-rl turns on with a table, even an empty one (`[slurm]`), that has no equivalent here. */
const refuseFeature = (from: string, reason: string): Alias => ({ ...refuse(from, reason, true), presence: true });
/** Accepted at the values that are our behaviour; any other value is refused with the reason. */
const only = (from: string, values: unknown[], reason: string, table = false): Alias => ({
  from,
  to: null,
  table,
  note: reason,
  check: (v) =>
    values.some((ok) => same(ok, v))
      ? undefined
      : `has no equivalent here for ${shown(v)} (${values.map(shown).join(' or ')} only): ${reason}`,
});
const move = (from: string, to: string, extra: Partial<Alias> = {}): Alias => ({ from, to, ...extra });

const PERF = 'a performance setting of the PyTorch trainer; results do not depend on it';
const LOGS = 'our processes log to <run>/logs/ at one level';
const SLURM =
  'SLURM jobs of this command: rl submits with [slurm] (docs/cluster.md, "SLURM"); run the others under any scheduler as docs/cluster.md shows';
const ENV_VARS = 'set variables in the environment of the prime-rl command: every process it starts inherits it';
const TRANSPORT = 'every part exchanges weights and batches through the run folder (output_dir), shared between hosts';
const TOKENIZER =
  "the model folder's own tokenizer and chat template are used (a different one would train other token ids than inference samples)";
const VLLM_ARG = 'a vLLM engine argument: our inference server is our native engine, with no counterpart for it';

// ---------------------------------------------------------------------------------------------
// Sources: [[orchestrator.train.source]], [[orchestrator.eval.source]], [[eval.source]]

/** verifiers EnvConfig fields that are not agents: every other table under `env` is one (any name). */
const ENV_FIELDS = new Set(['id', 'taskset', 'timeout', 'retries', 'max_concurrent_agents', 'interception']);

/** An agent's table; a runtime inside its harness (prime-rl's older spelling) moves beside it. */
function agentConfig(agent: Raw, key: string, where: string): Raw {
  const out = structuredClone(agent);
  if (isTable(out.harness) && 'runtime' in out.harness) {
    const { runtime, ...harness } = out.harness;
    if ('runtime' in out && !same(out.runtime, runtime))
      throw new ConfigError(`conflicting keys ${where}: ${key}.harness.runtime and ${key}.runtime differ; keep one`);
    out.harness = harness;
    out.runtime = runtime;
  }
  return out;
}

/** Sets `path` (dotted) in `tree`, making the tables on its way. */
function setIn(tree: Raw, path: string, value: unknown): void {
  const keys = path.split('.');
  let node = tree;
  for (const k of keys.slice(0, -1)) {
    if (!isTable(node[k])) node[k] = {};
    node = node[k] as Raw;
  }
  node[keys[keys.length - 1]] = value;
}

/**
 * A source's curriculum: its admission gates become the env's `gates` (the same shape); its task
 * sampler is our env mix's seeded draws (`standard`), a difficulty-pool sampler is refused.
 */
function curriculum(
  v: unknown,
  key: string,
  where: string,
  entry: Raw,
  show: (sub: string, where: string, value: unknown, note?: string) => void,
): void {
  if (!isTable(v)) throw new ConfigError(`${key} (${where}): expected a table (sampler, gates)`);
  for (const [k, x] of Object.entries(v)) {
    if (k === 'gates') {
      if (!isTable(x)) throw new ConfigError(`${key}.gates (${where}): expected a table of named gates`);
      for (const [name, gate] of Object.entries(x)) {
        if (!isTable(gate) || gate.type !== 'advantage_range')
          throw refusal(
            `${key}.gates.${name}.type`,
            where,
            `admission gate ${shown(isTable(gate) ? gate.type : gate)}: ours is advantage_range`,
          );
      }
      entry.gates = x;
      show('curriculum.gates', '.gates', x);
    } else if (k === 'sampler') {
      const type = isTable(x) ? (x.type ?? 'standard') : x;
      if (type !== 'standard' || (isTable(x) && Object.keys(x).some((f) => f !== 'type')))
        throw refusal(
          `${key}.sampler`,
          where,
          `task sampler ${shown(type)}: examples are drawn by the env mix's seeded stream (standard); difficulty weighting is orchestrator.difficulty_filter, which drops and refills groups by reward`,
        );
      show('curriculum.sampler', '', x, "examples are drawn by the env mix's seeded stream, as the standard sampler");
    } else throw refusal(`${key}.${k}`, where, 'a curriculum has a sampler and gates');
  }
}

interface SourceKind {
  /** train: an [[env]] entry of the training mix; eval: an eval environment. */
  kind: 'train' | 'eval';
  /** Where its group-level settings live in the file (`orchestrator`, `orchestrator.eval`, `eval`). */
  group: string;
  /** The group-level key of the group size, and its prime-rl default. */
  groupSize: string;
}

function sourceEntry(
  raw: unknown,
  i: number,
  at: ConvertAt,
  to: string,
  s: SourceKind,
): { entry: Raw; shown: Converted[] } {
  const key = `${at.key}[${i}]`;
  if (!isTable(raw)) throw new ConfigError(`${key} (${at.where}): expected a table ([[${at.key}]])`);
  const shownList: Converted[] = [];
  const show = (sub: string, where: string, value: unknown, note?: string) =>
    shownList.push({
      from: `${key}.${sub}`,
      to: where === '' ? null : `${to}[${i}]${where}`,
      value,
      note,
      display: true,
    });
  const env: Raw = {};
  let taskset: Raw | undefined;
  const entry: Raw = {};
  let tasksetKey = 'env.taskset';
  const setTaskset = (value: unknown, sub: string) => {
    if (!isTable(value)) throw new ConfigError(`${key}.${sub} (${at.where}): expected a table with the taskset's id`);
    if (taskset !== undefined)
      throw new ConfigError(
        `conflicting keys ${at.where}: ${key} names its taskset twice (env.taskset and taskset); keep one`,
      );
    taskset = value;
    tasksetKey = sub;
  };
  const setAgent = (name: string, value: Raw, sub: string) => {
    if (name in env)
      throw new ConfigError(`conflicting keys ${at.where}: ${key} configures agent '${name}' twice; keep one spelling`);
    env[name] = agentConfig(value, `${key}.${sub}`, at.where);
    show(sub, `.args.env.${name}`, env[name]);
  };
  const groupKey = (k: string) => (s.group === '' ? k : `${s.group}.${k}`);
  const groupValue = (k: string) => get(at.source, groupKey(k));
  for (const [k, v] of Object.entries(raw)) {
    switch (k) {
      case 'env':
        if (!isTable(v)) throw new ConfigError(`${key}.env (${at.where}): expected a table`);
        for (const [ek, ev] of Object.entries(v)) {
          if (ek === 'taskset') setTaskset(ev, 'env.taskset');
          else if (!ENV_FIELDS.has(ek) && isTable(ev)) setAgent(ek, ev, `env.${ek}`);
          else {
            env[ek] = ev;
            show(`env.${ek}`, `.args.env.${ek}`, ev);
          }
        }
        break;
      // prime-rl's earlier spelling: the taskset and the (single) agent's harness on the entry.
      case 'taskset':
        setTaskset(v, 'taskset');
        break;
      case 'harness':
        if (!isTable(v)) throw new ConfigError(`${key}.harness (${at.where}): expected a table`);
        setAgent('agent', { harness: v }, 'harness');
        break;
      case 'runtime':
        setAgent('agent', { runtime: v }, 'runtime');
        break;
      case 'name':
        show('name', '', v, 'a display name: our metrics and eval results name an environment by its id');
        break;
      case 'ratio':
        if (s.kind === 'eval') show('ratio', '', v, 'a sampling weight: an eval plays every source');
        else {
          entry.weight = v;
          show('ratio', '.weight', v);
        }
        break;
      case 'group_size':
      case 'rollouts_per_example':
        if (s.kind === 'eval') {
          entry.rollouts_per_example = v;
          show(k, '.rollouts_per_example', v);
        } else if (!same(v, groupValue(s.groupSize) ?? 1))
          throw refusal(
            `${key}.${k}`,
            at.where,
            `one group size for all training environments: set ${groupKey(s.groupSize)} (it is ${shown(groupValue(s.groupSize) ?? 1)})`,
          );
        else show(k, '', v, `${groupKey(s.groupSize)}, the same`);
        break;
      case 'num_examples':
        if (s.kind !== 'eval')
          throw refusal(`${key}.num_examples`, at.where, 'a training source plays its whole taskset');
        entry.num_examples = v;
        show('num_examples', '.num_examples', v);
        break;
      case 'interval':
        if (s.kind !== 'eval' || !same(v, groupValue('interval') ?? 100))
          throw refusal(
            `${key}.interval`,
            at.where,
            `one eval interval for all eval environments: set ${groupKey('interval')}`,
          );
        show('interval', '', v, `${groupKey('interval')}, the same`);
        break;
      case 'sampling':
        if (isTable(v) && Object.keys(v).length > 0)
          throw refusal(`${key}.sampling`, at.where, `one sampling for all environments: set ${groupKey('sampling')}`);
        break;
      case 'serve':
        if (isTable(v) && 'address' in v)
          throw refusal(
            `${key}.serve.address`,
            at.where,
            'our cpu workers start each env server themselves, on a free loopback port',
          );
        show(
          'serve',
          '',
          v,
          'the env server is started and sized by our cpu worker (args.max_concurrent bounds its rollouts)',
        );
        break;
      case 'address':
        throw refusal(
          `${key}.address`,
          at.where,
          'our cpu workers start each env server themselves, on a free loopback port',
        );
      case 'algo': {
        if (s.kind === 'eval')
          throw refusal(`${key}.algo`, at.where, 'an eval source plays the policy, it trains nothing');
        const at_ = `${to}[${i}]`;
        for (const c of algoConverted(v, `${key}.algo`, at.where, {
          advantage: `${at_}.advantage`,
          distill: `${at_}.distill`,
          echo: `${at_}.echo`,
          whole: true,
        })) {
          if (c.display) shownList.push(c);
          else setIn(entry, c.to!.slice(at_.length + 1), c.value);
        }
        break;
      }
      case 'curriculum':
        if (s.kind === 'eval')
          throw refusal(`${key}.curriculum`, at.where, 'an eval source plays every example it selects');
        curriculum(v, `${key}.curriculum`, at.where, entry, (sub, where, value, note) => show(sub, where, value, note));
        break;
      default:
        throw refusal(
          `${key}.${k}`,
          at.where,
          'not a field of a prime-rl source (name, env, serve, ratio, sampling, group_size; eval: num_examples, interval)',
        );
    }
  }
  const id = taskset?.id;
  if (typeof id !== 'string' || id === '')
    throw new ConfigError(`${key} (${at.where}): no env configured: set env.taskset.id, the verifiers taskset`);
  const { id: _id, ...tasksetFields } = taskset!;
  entry.id = `verifiers:${id}`;
  // A training source trains on the whole taskset; an eval source evaluates on all of it.
  entry.args = { taskset: tasksetFields, env, eval_size: s.kind === 'train' ? 0 : 'all' };
  shownList.unshift({ from: `${key}.${tasksetKey}.id`, to: `${to}[${i}].id`, value: entry.id, display: true });
  if (Object.keys(tasksetFields).length > 0) show(tasksetKey, '.args.taskset', tasksetFields);
  return { entry: { ...entry, id: entry.id, args: entry.args }, shown: shownList };
}

/** A list of prime-rl sources -> our environment entries at `to`. */
const sources = (from: string, to: string, s: SourceKind): Alias => ({
  from,
  to,
  convert: (value, at) => {
    if (!Array.isArray(value))
      throw new ConfigError(`${at.key} (${at.where}): expected a list of tables ([[${at.key}]])`);
    const made = value.map((raw, i) => sourceEntry(raw, i, at, to, s));
    const list = made.map((m) => {
      const { id, args, ...rest } = m.entry;
      return { id, args, ...rest };
    });
    return [{ to, value: list, quiet: true }, ...made.flatMap((m) => m.shown)];
  },
});

// ---------------------------------------------------------------------------------------------
// Sampling: prime-rl's TrainSamplingConfig / EvalSamplingConfig

/** `extra_body`: the keys vLLM takes that are ours too; any other is refused. */
function extraBody(to: string): Alias {
  return {
    from: '',
    to,
    convert: (value, at) => {
      if (!isTable(value)) throw new ConfigError(`${at.key} (${at.where}): expected a table`);
      return Object.entries(value).map(([k, v]): Converted => {
        if (['top_k', 'min_p', 'top_p', 'stop'].includes(k))
          return { from: `${at.key}.${k}`, to: `${to}.${k}`, value: v };
        if (k === 'return_token_ids' && v === true)
          return { from: `${at.key}.${k}`, to: null, value: v, note: 'our samples always keep their token ids' };
        throw refusal(
          `${at.key}.${k}`,
          at.where,
          'a vLLM request field our server has no counterpart for (it takes top_k, min_p, top_p, stop)',
        );
      });
    },
  };
}

function sampling(from: string, to: string): Alias[] {
  return [
    { ...extraBody(to), from: `${from}.extra_body` },
    refuse(
      `${from}.reasoning_effort`,
      'reasoning effort is a hosted API setting; our server samples the chat template as given',
    ),
    move(from, to, { table: true, renames: { max_completion_tokens: 'max_tokens' } }),
  ];
}

/** `[select] limit`: the first N examples of each source (our num_examples); the rest refused. */
const selectKeys = (from: string, to: string): Alias[] => [
  move(`${from}.limit`, to),
  only(`${from}.shuffle`, [false], "the examples are each source's first N, in order"),
  only(`${from}.offset`, [0], "the examples are each source's first N"),
  refuse(from, "the examples are each source's first N (limit)", true),
];

/** An eval's `[client]`: base_url and api_key_var are ours; the rest refused or changes nothing. */
const clientKeys = (from: string, to: string): Alias[] => {
  const why = 'client settings: client.base_url and client.api_key_var (a bearer token)';
  return [
    // At the top level the two are ours: moved only from [eval.client].
    ...(from === to
      ? []
      : [move(`${from}.base_url`, `${to}.base_url`), move(`${from}.api_key_var`, `${to}.api_key_var`)]),
    accept(`${from}.wait_for_ready_timeout`, 'every wait has its own deadline here'),
    accept(`${from}.skip_model_check`, 'the eval checks its server itself'),
    accept(`${from}.extra_headers_from_state`, 'session routing headers: requests go by load here'),
    only(`${from}.type`, ['eval'], 'an eval client'),
    refuse(`${from}.headers`, why),
    refuse(`${from}.headers_from_env`, why),
    refuse(`${from}.admin_base_url`, 'the eval updates no weights on an external server'),
    ...(from === to ? [] : [refuse(from, why, true)]),
  ];
};

// ---------------------------------------------------------------------------------------------
// Shared blocks

const wandbKeys = (from: string): Alias[] => [
  refuse(`${from}.group`, 'W&B groups: our runs log under [wandb] project, name and entity'),
  refuse(`${from}.tags`, 'W&B tags: our runs log under [wandb] project, name and entity'),
  only(`${from}.offline`, [false], 'offline W&B: set WANDB_MODE=offline for the run (it keeps a local run folder)'),
  move(from, 'wandb', { table: true }),
];

const monitors = (prefix: string, wandb: boolean): Alias[] => [
  ...(wandb
    ? wandbKeys(`${prefix}monitors.wandb`)
    : [
        refuseFeature(
          `${prefix}monitors.wandb`,
          'only `prime-rl rl` logs to W&B (sft and eval runs write metrics.jsonl and the report)',
        ),
      ]),
  only(`${prefix}monitors.file.path`, ['metrics.jsonl'], 'metrics always go to <run>/metrics.jsonl'),
  accept(`${prefix}monitors.file`, 'metrics always go to <run>/metrics.jsonl', true),
  refuseFeature(`${prefix}monitors.prime`, 'the Prime Intellect platform monitor'),
];

/** `[ckpt]` (ours too, at the top) and the trainer's and orchestrator's, which are the same checkpoints here. */
const ckptKeys = (prefix: string): Alias[] => [
  ...(prefix
    ? [move(`${prefix}ckpt.interval`, 'ckpt.interval'), move(`${prefix}ckpt.keep_last`, 'ckpt.keep_last')]
    : []),
  refuse(`${prefix}ckpt.keep_interval`, 'checkpoints kept forever every N steps: ckpt.keep_last keeps the newest N'),
  refuse(`${prefix}ckpt.output_dir`, 'checkpoints live in the run folder (<run>/checkpoints/)'),
  refuse(`${prefix}ckpt.wait_for_weights_timeout`, 'every wait has its own deadline here'),
  only(`${prefix}ckpt.skip_progress`, [false], 'a checkpoint restores all of its state'),
  move(`${prefix}ckpt.skip_scheduler`, 'ckpt.skip_scheduler'),
  only(
    `${prefix}ckpt.skip_dataloader`,
    [false],
    'the data of every step is a pure function of the seed and the step: a resumed run reads on where it was',
  ),
  move(`${prefix}ckpt.skip_optimizer`, 'ckpt.skip_optimizer'),
  // An empty table (checkpoints at the end) is [ckpt]'s; a key not above has no counterpart.
  ...(prefix
    ? [refuse(`${prefix}ckpt`, "the run's checkpoints are [ckpt]'s (interval, keep_last, resume_step)", true)]
    : []),
];

const resumeKeys = (prefix: string): Alias[] => [
  move(`${prefix}resume.step`, 'ckpt.resume_step'),
  refuse(`${prefix}resume.dir`, "another run's checkpoint: copy its run folder and resume it with ckpt.resume_step"),
  accept(
    `${prefix}resume`,
    'running the same command again resumes the run where it is (ckpt.resume_step picks a checkpoint)',
    true,
  ),
];

/**
 * `[weight_broadcast]`, shared or under trainer / orchestrator / inference: rl's is our
 * [weight_broadcast] (filesystem or nccl: lib/config/schemas/weights.ts); sft and eval have none.
 */
const broadcastKeys = (prefix: string, rl = false): Alias[] => [
  ...(rl
    ? [
        ...(prefix === ''
          ? []
          : ['type', 'host', 'port'].map((k) => move(`${prefix}weight_broadcast.${k}`, `weight_broadcast.${k}`))),
        move(`${prefix}weight_broadcast.timeout`, 'weight_broadcast.timeout_s'),
        only(
          `${prefix}weight_broadcast.quantize_in_weight_transfer`,
          [false],
          'FP8 weight transfer: versions travel in the model dtype',
        ),
      ]
    : [
        only(`${prefix}weight_broadcast.type`, ['filesystem'], TRANSPORT),
        refuse(`${prefix}weight_broadcast`, TRANSPORT, true),
      ]),
  accept(`${prefix}rollout_transport.type`, TRANSPORT),
  refuse(`${prefix}rollout_transport`, TRANSPORT, true),
];

const tokenizerKeys = (prefix: string): Alias[] => [
  only(`${prefix}tokenizer.trust_remote_code`, [false, null], 'no model code runs here'),
  refuse(`${prefix}tokenizer`, TOKENIZER, true),
];

/** prime-rl's trainer ModelConfig (`[trainer.model]` in rl, `[model]` in sft) beside our model table. */
function trainerModel(prefix: string, seqLenTo: string | null, lora: string): Alias[] {
  const m = `${prefix}model`;
  return [
    seqLenTo === null
      ? accept(`${m}.seq_len`, 'the longest sequence is data.seq_len (seq_len), which every row is packed to')
      : move(`${m}.seq_len`, seqLenTo),
    only(
      `${m}.impl`,
      ['auto', 'custom', 'hf'],
      'one implementation: the native engine, numerically a transformers model',
    ),
    only(
      `${m}.attn`,
      ['auto', 'flash_attention_2', 'flash_attention_3', 'flash_attention_4'],
      'attention is exact here whatever the kernel',
    ),
    accept(`${m}.compile`, PERF, true),
    only(`${m}.compile`, ['None', null, false], `torch.compile is off ("None"); ${PERF}`),
    only(`${m}.ac.mode`, ['full'], 'whole decoder layers are checkpointed ([model.ac] freq)'),
    accept(`${m}.ac.targets`, 'selective checkpoint targets: whole layers are checkpointed here'),
    accept(`${m}.ac_offloading`, PERF, true),
    accept(`${m}.fsdp_cpu_offload`, PERF),
    accept(`${m}.optim_cpu_offload`, PERF),
    accept(`${m}.full_offload`, `optimizer offload to the CPU: ${PERF}`),
    accept(`${m}.reshard_after_forward`, PERF),
    only(`${m}.dp_replicate`, [1], 'data parallelism is trainer.world_size'),
    only(`${m}.ep`, ['auto', 1], 'expert parallelism: every rank holds every expert'),
    accept(`${m}.ep_comm_backend`, PERF),
    accept(`${m}.deepep_num_sms`, PERF),
    accept(`${m}.deepep_token_chunk_size`, PERF),
    only(`${m}.cp`, [1], 'context parallelism: a row is trained on one rank'),
    accept(`${m}.cp_style`, PERF),
    only(
      `${m}.optimization_dtype`,
      ['float32'],
      'optimizer state and master weights are fp32 (bf16 training is mixed precision: [model] dtype)',
    ),
    only(`${m}.reduce_dtype`, ['float32'], 'gradients are reduced in fp32'),
    only(`${m}.moe_router_dtype`, ['float32'], 'router logits are computed in fp32'),
    accept(`${m}.moe_use_grouped_mm`, PERF),
    only(`${m}.moe_fused_kernel`, [false], 'a Blackwell fused MoE kernel'),
    only(`${m}.quantization`, [null], 'FP8 training'),
    only(`${m}.index_cache`, [null], 'sparse-attention index caching (DSA models)'),
    only(`${m}.freeze_moe_router`, [false], 'router weights always train'),
    accept(`${m}.fused_lm_head_token_chunk_size`, PERF),
    accept(`${m}.conversion_dir`, 'weights load as they are in the model folder'),
    only(`${m}.trust_remote_code`, [false], 'no model code runs here'),
    refuseFeature(`${m}.vlm`, 'vision-language models'),
    refuse(`${m}.debug`, 'model debugging overrides', true),
    refuse(`${m}.lora.modules_to_save`, 'LoRA trains the adapters only'),
    // An empty [model.lora] table turns LoRA on with its defaults.
    {
      from: `${m}.lora`,
      to: lora,
      when: (v) => isTable(v) && Object.keys(v).length === 0,
      convert: () => [{ to: `${lora}.enabled`, value: true }],
    },
    {
      from: `${m}.lora`,
      to: lora,
      table: true,
      note: 'a [lora] table turns LoRA on',
      convert: (v, at) => [
        { to: `${lora}.${at.key.slice(`${m}.lora.`.length)}`, value: v },
        { to: `${lora}.enabled`, value: true, quiet: true },
      ],
    },
  ];
}

const optimKeys = (prefix: string, to: string): Alias[] => [
  only(`${prefix}optim.type`, ['adamw'], 'the optimizer is AdamW'),
  {
    from: `${prefix}optim.betas1`,
    to: `${to}.betas`,
    convert: (v, at) => [{ to: `${to}.betas`, value: [v, get(at.source, `${prefix}optim.betas2`) ?? 0.999] }],
  },
  {
    from: `${prefix}optim.betas2`,
    to: `${to}.betas`,
    convert: (v, at) => [{ to: `${to}.betas`, value: [get(at.source, `${prefix}optim.betas1`) ?? 0.9, v] }],
  },
  refuse(`${prefix}optim.nesterov`, 'the optimizer is AdamW'),
  refuse(`${prefix}optim.momentum`, 'the optimizer is AdamW'),
  refuse(`${prefix}optim.mu`, 'the optimizer is AdamW'),
];

const schedulerKeys = (prefix: string): Alias[] => [
  {
    from: `${prefix}scheduler.decay_steps`,
    to: null,
    note: 'our linear schedule decays from the end of warmup to max_steps',
    check: (v, source) => {
      const max = get(source, 'max_steps') ?? get(source, `${prefix}max_steps`);
      const warmup = get(source, `${prefix}scheduler.warmup_steps`) ?? 10;
      return typeof max === 'number' && v === max - (warmup as number)
        ? undefined
        : `has no equivalent here for ${shown(v)}: our linear schedule decays from the end of warmup to max_steps (decay_steps = max_steps - warmup_steps only)`;
    },
  },
];

const deploymentKeys = (prefix: string, inferGpus: string | null): Alias[] => [
  only(
    `${prefix}deployment.type`,
    ['single_node'],
    'a multi-node deployment: start the pieces on each host (docs/cluster.md, "Several hosts")',
  ),
  move(`${prefix}deployment.num_train_gpus`, 'trainer.world_size', { note: 'one trainer rank per GPU' }),
  inferGpus === null
    ? only(`${prefix}deployment.num_infer_gpus`, [1], 'one inference server serves the evals of an SFT run')
    : move(`${prefix}deployment.num_infer_gpus`, inferGpus, { note: 'one local inference server per GPU' }),
  accept(`${prefix}deployment.gpus_per_node`, 'a bound prime-rl checks GPU counts against'),
  refuse(
    `${prefix}deployment`,
    'a multi-node deployment: start the pieces on each host (docs/cluster.md, "Several hosts")',
    true,
  ),
];

/** `slurm`: rl's [slurm] is ours (lib/config/schemas/slurm.ts); elsewhere it is refused. */
const commonTop = (prefix = '', slurm = false): Alias[] => [
  refuse(`${prefix}env_vars`, ENV_VARS, true),
  refuse(`${prefix}log`, LOGS, true),
  ...(slurm
    ? [only(`${prefix}slurm.dry_run`, [false], 'give --dry-run on the command line: it writes the script, unsubmitted')]
    : [refuseFeature(`${prefix}slurm`, SLURM)]),
  refuseFeature(
    `${prefix}heartbeat`,
    'BetterStack heartbeats: watch runs with `prime-rl runs show`, the Temporal UI or metrics.jsonl',
  ),
  refuseFeature(`${prefix}metrics_server`, "Prometheus: the inference server's /metrics"),
  only(`${prefix}dry_run`, [false], 'give --dry-run on the command line'),
  only(`${prefix}clean`, [false], 'a run folder holding another run is refused, never deleted: remove it yourself'),
  move(`${prefix}run.name`, 'run_name'),
  refuse(`${prefix}run.dir`, 'the run folder is output_dir/run_name'),
  accept(`${prefix}matmul_precision`, 'fp32 matmuls are full fp32 here'),
  accept(`${prefix}gc`, "Python's garbage collector", true),
  refuse(`${prefix}memory_profiler_path`, 'memory profiles: bench/ has the profiling tools'),
  refuse(`${prefix}trace_path`, 'PyTorch profiler traces: bench/compare.ts --profile'),
  move(`${prefix}dist_timeout_seconds`, 'trainer.dist.timeout_s'),
];

/** prime-rl's inference config (`[inference]`); `to` our inference section, null where there is none to set. */
function inferenceKeys(rl: boolean): Alias[] {
  const v = 'inference.vllm';
  return [
    rl
      ? move(`${v}.model`, 'model.name', { note: 'the shared model (a different one is an error)' })
      : accept(`${v}.model`, 'the model is model.name'),
    rl
      ? move(`${v}.max_model_len`, 'inference.seq_len', { note: "our server's context length; at least seq_len" })
      : accept(`${v}.max_model_len`, 'the eval server holds sequences of seq_len'),
    only(
      `${v}.dtype`,
      ['auto', 'float32', 'bfloat16'],
      'weights compute in float32 or bfloat16 ([inference.model] dtype)',
    ),
    rl ? move(`${v}.enforce_eager`, 'inference.model.enforce_eager') : accept(`${v}.enforce_eager`, PERF),
    only(`${v}.trust_remote_code`, [false], 'no model code runs here'),
    refuse(`${v}.chat_template`, TOKENIZER),
    accept(
      `${v}.tool_call_parser`,
      "rollouts are token in, token out; verifiers' renderer parses tool calls ([orchestrator.renderer])",
    ),
    accept(
      `${v}.reasoning_parser`,
      "rollouts are token in, token out; verifiers' renderer parses reasoning ([orchestrator.renderer])",
    ),
    only(`${v}.rope_scaling`, [null], 'RoPE scaling overrides: the model config.json says how it scales'),
    only(`${v}.tensor_parallel_size`, [1], 'tensor parallelism: a server holds the whole model'),
    rl
      ? move(`${v}.data_parallel_size`, 'inference.replicas', {
          note: 'that many local inference servers, each the whole model',
        })
      : only(`${v}.data_parallel_size`, [1], 'one inference server serves the evals of an SFT run'),
    only(`${v}.data_parallel_size_local`, [null, 1], 'one local inference server per run'),
    accept(`${v}.data_parallel_rpc_port`, 'vLLM data-parallel RPC'),
    accept(`${v}.api_server_count`, 'vLLM API processes'),
    accept(`${v}.seed`, "sampling seeds are per request (the run's seed)"),
    {
      from: `${v}.gpu_memory_utilization`,
      to: 'inference.gpu_memory_utilization',
      note: 'the device memory share the server uses at most, KV cache included (CUDA)',
      convert: (value, at) =>
        // The same key of ours, where the server runs on CUDA; on the CPU the KV cache is
        // inference.kv_cache_tokens (max_running x seq_len unset): the share sizes nothing there.
        String(get(at.source, 'inference.model.device') ?? 'cpu').startsWith('cuda')
          ? [{ to: 'inference.gpu_memory_utilization', value }]
          : [
              {
                to: null,
                value,
                note: "sizes a CUDA device's KV cache (inference.model.device = cuda): on the CPU, where this server runs, inference.kv_cache_tokens sizes it",
              },
            ],
    },
    only(`${v}.enable_prefix_caching`, [null, false], 'a prefix cache'),
    only(`${v}.quantization`, [null], 'quantized inference'),
    accept(`${v}.enable_lora`, 'LoRA weights are merged into the weights the server loads'),
    accept(`${v}.max_loras`, 'LoRA weights are merged into the weights the server loads'),
    accept(`${v}.max_cpu_loras`, 'LoRA weights are merged into the weights the server loads'),
    accept(`${v}.max_lora_rank`, 'LoRA weights are merged into the weights the server loads'),
    accept(`${v}.lora_target_modules`, 'LoRA weights are merged into the weights the server loads'),
    only(`${v}.enable_expert_parallel`, [false], 'expert parallelism: a server holds every expert'),
    accept(`${v}.all2all_backend`, PERF),
    only(`${v}.enable_eplb`, [false], 'expert load balancing'),
    only(`${v}.enable_dbo`, [false], 'dual batch overlap'),
    accept(`${v}.enable_return_routed_experts`, '/v1/generate returns routes when asked (trainer.moe.router_replay)'),
    refuse(v, VLLM_ARG, true),
    only('inference.server.liveness_timeout_seconds', [30], 'our /health answers from the server loop'),
    accept(
      'inference.router',
      'requests go by load over orchestrator.base_urls, a failed server set aside (docs/cluster.md)',
      true,
    ),
    accept('inference.backend_port', 'no router process: the server listens on inference.server.port'),
    refuse('inference.log', LOGS, true),
    refuse('inference.env_vars', ENV_VARS, true),
    only('inference.use_deep_gemm', [false], 'FP8 DeepGEMM kernels'),
    ...broadcastKeys('inference.', rl),
    refuseFeature('inference.kv_cache_offload', 'KV cache offload to CPU or disk'),
    only('inference.use_pd_kv_transfer', [false], 'prefill/decode disaggregation'),
    accept('inference.enable_fp32_lm_head', "the LM head's log-softmax is fp32"),
    accept('inference.enable_fp32_router_logits', 'router logits are fp32'),
    only('inference.deployment.type', ['single_node'], 'a multi-node inference deployment: start servers on each host'),
    accept('inference.deployment.gpus_per_node', 'a bound prime-rl checks GPU counts against'),
    refuse('inference.deployment', 'a multi-node inference deployment: start servers on each host', true),
    refuseFeature('inference.slurm', SLURM),
    only('inference.dry_run', [false], 'give --dry-run on the command line'),
  ];
}

/** The top-level blocks `rl` and `sft` share; `inferGpus`: where num_infer_gpus goes (null: one server only). */
const trainingTop = (wandb: boolean, inferGpus: string | null, rl = false): Alias[] => [
  // First: a multi-node file is refused for its deployment, before any of its other keys.
  ...deploymentKeys('', inferGpus),
  ...commonTop('', rl),
  ...ckptKeys(''),
  ...resumeKeys(''),
  ...monitors('', wandb),
  ...broadcastKeys('', rl),
  ...tokenizerKeys(''),
];

// ---------------------------------------------------------------------------------------------
// rl

/** The orchestrator's LoRA `key` (prime-rl's per-run adapter): the trainer's own, or refused. */
const loraAsTrainer = (key: 'rank' | 'alpha', dflt: number): Alias => ({
  from: `orchestrator.model.lora.${key}`,
  to: null,
  note: `the run's LoRA ${key} (trainer.lora.${key}), the same`,
  check: (v, src) =>
    same(v, get(src, `trainer.model.lora.${key}`) ?? get(src, `trainer.lora.${key}`) ?? dflt)
      ? undefined
      : `has no equivalent here for ${shown(v)}: one LoRA ${key} per run, the trainer's (trainer.model.lora.${key})`,
});

const ORCH = 'orchestrator';

export const PRIME_RL_RL_KEYS: readonly Alias[] = [
  ...trainingTop(true, 'inference.replicas', true),
  refuseFeature('model.vlm', 'vision-language models'),
  // [orchestrator]
  move(`${ORCH}.group_size`, `${ORCH}.rollouts_per_example`),
  sources(`${ORCH}.train.source`, 'env', { kind: 'train', group: ORCH, groupSize: 'group_size' }),
  sources(`${ORCH}.train.env`, 'env', { kind: 'train', group: ORCH, groupSize: 'group_size' }),
  ...sampling(`${ORCH}.train.sampling`, `${ORCH}.sampling`),
  move(`${ORCH}.train.filter_zero_advantages`, `${ORCH}.filter_zero_advantages`),
  sources(`${ORCH}.eval.source`, 'eval.env', { kind: 'eval', group: `${ORCH}.eval`, groupSize: 'group_size' }),
  sources(`${ORCH}.eval.env`, 'eval.env', { kind: 'eval', group: `${ORCH}.eval`, groupSize: 'group_size' }),
  move(`${ORCH}.eval.interval`, 'eval.interval'),
  move(`${ORCH}.eval.num_examples`, 'eval.num_examples'),
  move(`${ORCH}.eval.group_size`, 'eval.rollouts_per_example'),
  ...sampling(`${ORCH}.eval.sampling`, 'eval.sampling'),
  only(`${ORCH}.eval.skip_first_step`, [false], 'the base model is always evaluated first'),
  only(`${ORCH}.eval.retrigger_on_resume`, [false], 'evals of versions up to the resume step are kept'),
  {
    from: `${ORCH}.algo`,
    to: null,
    note: 'the algorithm: orchestrator.advantage, [distill] and orchestrator.echo (docs/algorithms.md)',
    convert: (v, at) =>
      algoConverted(v, at.key, at.where, {
        advantage: `${ORCH}.advantage`,
        distill: 'distill',
        echo: `${ORCH}.echo`,
        whole: false,
      }),
  },
  move(`${ORCH}.model.client.base_url`, `${ORCH}.base_urls`, {
    convert: (v) => [{ to: `${ORCH}.base_urls`, value: Array.isArray(v) ? v : [v] }],
  }),
  accept(`${ORCH}.model.client.wait_for_ready_timeout`, 'every wait has its own deadline here'),
  accept(`${ORCH}.model.client.skip_model_check`, 'the run checks its own servers'),
  accept(`${ORCH}.model.client.extra_headers_from_state`, 'session routing headers: requests go by load here'),
  refuse(`${ORCH}.model.client`, 'client settings: inference.server.api_key_var is the key both sides use', true),
  accept(
    `${ORCH}.model.lora.name`,
    "the adapter's name on the servers: the trainer merges LoRA into the weights they load, which need no name",
  ),
  loraAsTrainer('rank', 16),
  loraAsTrainer('alpha', 32),
  refuse(`${ORCH}.model.lora`, "LoRA is the trainer's ([trainer.model.lora]): name, rank and alpha only here", true),
  refuseFeature(`${ORCH}.model.vlm`, 'vision-language models'),
  only(`${ORCH}.model.trust_remote_code`, [false], 'no model code runs here'),
  ...tokenizerKeys(`${ORCH}.`),
  refuse(`${ORCH}.log`, LOGS, true),
  refuse(`${ORCH}.env_vars`, ENV_VARS, true),
  ...monitors(`${ORCH}.`, true),
  accept(
    `${ORCH}.collect_inference_metrics`,
    "the servers' /metrics are read for the concurrency of the rollouts (orchestrator.concurrency); W&B gets our metrics",
  ),
  refuse(`${ORCH}.inference_metrics_roles`, 'prefill/decode disaggregation'),
  ...ckptKeys(`${ORCH}.`),
  ...resumeKeys(`${ORCH}.`),
  ...broadcastKeys(`${ORCH}.`, true),
  refuse(
    `${ORCH}.tasks_per_minute`,
    'a dispatch rate limit: the rollouts in flight are bounded by orchestrator.concurrency (min_inflight, max_inflight)',
  ),
  accept(`${ORCH}.env_server_base_port`, 'env servers bind free loopback ports'),
  refuse(`${ORCH}.token_batch_size`, 'token-based batches: orchestrator.batch_size counts rollouts'),
  move(`${ORCH}.num_train_workers`, 'trainer.world_size'),
  only(`${ORCH}.pad_to_multiple_of`, [1], 'context parallelism: a row is trained on one rank'),
  move(`${ORCH}.max_off_policy_steps`, `${ORCH}.in_flight.max_off_policy_steps`, {
    note: 'the bound of in-flight mode (orchestrator.in_flight.enabled); strict mode, the default, samples step n from policy n - async_level exactly',
  }),
  // [trainer]
  ...trainerModel('trainer.', 'trainer.seq_len', 'trainer.lora'),
  refuse('trainer.data', 'fake data', true),
  {
    from: 'trainer.loss.type',
    to: 'trainer.loss.type',
    when: (v) => v === 'default' || v === 'custom',
    convert: (v, at) => {
      if (v === 'custom')
        throw refusal(at.key, at.where, 'custom loss functions: add a loss to the native registry (ARCHITECTURE.md)');
      return [{ to: 'trainer.loss.type', value: 'dppo', note: "prime-rl's default loss is DPPO" }];
    },
  },
  refuse('trainer.loss.import_path', 'custom loss functions: add a loss to the native registry (ARCHITECTURE.md)'),
  refuse('trainer.loss.kwargs', 'custom loss functions: add a loss to the native registry (ARCHITECTURE.md)'),
  ...optimKeys('trainer.', 'trainer.optim'),
  ...schedulerKeys('trainer.'),
  ...ckptKeys('trainer.'),
  ...resumeKeys('trainer.'),
  ...broadcastKeys('trainer.', true),
  ...tokenizerKeys('trainer.'),
  refuse('trainer.log', LOGS, true),
  ...monitors('trainer.', true),
  accept('trainer.matmul_precision', 'fp32 matmuls are full fp32 here'),
  move('trainer.enable_router_replay', 'trainer.moe.router_replay'),
  refuse('trainer.memory_profiler_path', 'memory profiles: bench/ has the profiling tools'),
  accept('trainer.gc', "Python's garbage collector", true),
  refuse('trainer.trace_path', 'PyTorch profiler traces: bench/compare.ts --profile'),
  move('trainer.dist_timeout_seconds', 'trainer.dist.timeout_s'),
  refuseFeature('trainer.heartbeat', 'BetterStack heartbeats'),
  refuseFeature('trainer.metrics_server', "Prometheus: the inference server's /metrics"),
  only(
    'trainer.enable_token_export',
    [false],
    'per-token exports: the batches keep every token (batches/step_n.safetensors)',
  ),
  refuse('trainer.env_vars', ENV_VARS, true),
  // [orchestrator.renderer] is ours too (orchestrator.renderer); [inference]
  ...inferenceKeys(true),
];

// ---------------------------------------------------------------------------------------------
// sft

export const PRIME_RL_SFT_KEYS: readonly Alias[] = [
  ...trainingTop(false, null),
  {
    from: 'renderer',
    to: 'eval.renderer',
    note: "SFT samples render with the model's chat template (a typed renderer reproduces it); the evals' verifiers env servers render with this",
    convert: (v, at) =>
      get(at.source, 'eval.source') === undefined
        ? [
            {
              to: null,
              value: v,
              note: "SFT samples render with the model's chat template (a typed renderer reproduces it)",
            },
          ]
        : [{ to: 'eval.renderer', value: v }],
  },
  ...trainerModel('', null, 'lora'),
  only('data.type', ['sft'], 'fake data'),
  {
    from: 'data.source',
    to: 'data.source',
    convert: (v, at) => {
      if (!Array.isArray(v))
        throw new ConfigError(`${at.key} (${at.where}): expected a list of tables ([[data.source]])`);
      const shownList: Converted[] = [];
      const list = v.map((raw, i) => {
        const key = `${at.key}[${i}]`;
        if (!isTable(raw)) throw new ConfigError(`${key} (${at.where}): expected a table`);
        const out: Raw = {};
        for (const [k, x] of Object.entries(raw)) {
          const ours = k === 'dataset' ? 'name' : k;
          if (!['name', 'path', 'split', 'subset', 'ratio', 'num_examples', 'renderer'].includes(ours))
            throw refusal(
              `${key}.${k}`,
              at.where,
              'not a field of a data source (dataset, split, subset, ratio, renderer)',
            );
          if (ours === 'renderer') {
            const name = isTable(x) ? (x.name ?? 'auto') : x;
            if (
              !isTable(x) ||
              !['auto', 'default'].includes(name as string) ||
              Object.keys(x).some((f) => f !== 'name')
            )
              throw refusal(
                `${key}.renderer`,
                at.where,
                `renderer ${shown(name)} of the renderers package: a source renders with the model's chat template (auto, default) or a Jinja template of its own (renderer.chat_template)`,
              );
          }
          out[ours] = x;
          shownList.push({ from: `${key}.${k}`, to: `data.source[${i}].${ours}`, value: x, display: true });
        }
        return out;
      });
      return [{ to: 'data.source', value: list, quiet: true }, ...shownList];
    },
  },
  refuse('data.subsets', "dataset configurations (the README's configs): point data.name at the folder of one"),
  {
    from: 'data.splits',
    to: 'data.split',
    convert: (v, at) => {
      if (!Array.isArray(v) || v.length !== 1)
        throw refusal(at.key, at.where, 'one split per dataset (data.split): interleaving several is not supported');
      return [{ to: 'data.split', value: v[0] }];
    },
  },
  refuse('data.probabilities', 'interleaving several splits'),
  accept('data.stopping_strategy', 'one split: nothing to interleave'),
  only('data.shuffle', [true], 'every epoch is shuffled (seed)'),
  move('data.seed', 'seed'),
  {
    from: 'data.loss_mask',
    to: 'data.loss_roles',
    convert: (v, at) => {
      if (!isTable(v)) throw new ConfigError(`${at.key} (${at.where}): expected a table of roles`);
      const mask: Raw = { system: false, user: false, assistant: true, tool: false, ...v };
      return [{ to: 'data.loss_roles', value: Object.keys(mask).filter((r) => mask[r] === true) }];
    },
  },
  move('data.batch_size', 'batch_size'),
  move('data.seq_len', 'seq_len'),
  accept(
    'data.micro_batch_size',
    "the trainer runs one packed row (seq_len tokens) per forward/backward and sums a step's rows into one update",
  ),
  accept('data.num_workers', 'the data is tokenised and packed once, before the first step'),
  only('val.eval_on_start', [false], 'validation runs every val.interval steps and at the end'),
  {
    from: 'val.data',
    to: 'val.name',
    convert: (v, at) => {
      if (!isTable(v)) throw new ConfigError(`${at.key} (${at.where}): expected a table`);
      const out: Converted[] = [];
      for (const [k, x] of Object.entries(v)) {
        if (k === 'name') out.push({ from: `${at.key}.name`, to: 'val.name', value: x });
        else if (k === 'splits') {
          if (!Array.isArray(x) || x.length !== 1)
            throw refusal(`${at.key}.splits`, at.where, 'one validation split (val.split)');
          out.push({ from: `${at.key}.splits`, to: 'val.split', value: x[0] });
        } else if (k === 'type') {
          if (x !== 'sft') throw refusal(`${at.key}.type`, at.where, 'fake data');
        } else if (['seq_len', 'batch_size'].includes(k)) {
          if (!same(x, get(at.source, `data.${k}`)))
            throw refusal(
              `${at.key}.${k}`,
              at.where,
              `validation batches are packed like the training data (data.${k})`,
            );
        } else if (!['micro_batch_size', 'num_workers', 'shuffle', 'seed'].includes(k))
          throw refusal(`${at.key}.${k}`, at.where, 'the validation set is val.name and val.split');
      }
      // prime-rl reads the train split unless splits say otherwise.
      if (!('splits' in v))
        out.push({
          from: `${at.key}.name`,
          to: 'val.split',
          value: 'train',
          note: 'prime-rl reads the train split unless splits say otherwise',
        });
      return out;
    },
  },
  sources('eval.source', 'eval.env', { kind: 'eval', group: 'eval', groupSize: 'group_size' }),
  move('eval.group_size', 'eval.rollouts_per_example'),
  ...sampling('eval.sampling', 'eval.sampling').filter((a) => a.from !== 'eval.sampling'),
  move('eval.sampling.max_completion_tokens', 'eval.sampling.max_tokens'),
  only('eval.skip_first_step', [false], 'the base model is always evaluated first'),
  only('eval.retrigger_on_resume', [false], 'evals of versions up to the resume step are kept'),
  ...selectKeys('eval.select', 'eval.num_examples'),
  refuse('eval.client', 'the evals sample from the inference server the SFT run starts (inference.server)', true),
  accept('eval.env_server_base_port', 'env servers bind free loopback ports'),
  ...optimKeys('', 'optim'),
  ...schedulerKeys(''),
  ...inferenceKeys(false),
];

// ---------------------------------------------------------------------------------------------
// eval (prime-rl's `evals` config: a model, an [eval] block of sources)

export const PRIME_RL_EVAL_KEYS: readonly Alias[] = [
  ...commonTop(),
  ...monitors('', false),
  ...broadcastKeys(''),
  // Today's shape: the sources and their settings at the top level.
  sources('source', 'env', { kind: 'eval', group: '', groupSize: 'group_size' }),
  move('group_size', 'rollouts_per_example'),
  ...selectKeys('select', 'num_examples'),
  ...sampling('sampling', 'sampling'),
  ...clientKeys('client', 'client'),
  accept('resume', 'running the same command again resumes the eval where it stopped (its finished rollouts are kept)'),
  accept('env_server_base_port', 'env servers bind free loopback ports'),
  // The shape before: a model and an [eval] block of sources.
  sources('eval.source', 'env', { kind: 'eval', group: 'eval', groupSize: 'group_size' }),
  move('eval.num_examples', 'num_examples'),
  move('eval.group_size', 'rollouts_per_example'),
  ...selectKeys('eval.select', 'num_examples'),
  ...sampling('eval.sampling', 'sampling'),
  accept('eval.interval', 'a standalone eval runs once over its versions'),
  only('eval.skip_first_step', [false], 'the base model is evaluated unless eval_base = false'),
  only('eval.retrigger_on_resume', [false], 'finished (version, environment) results are kept'),
  ...clientKeys('eval.client', 'client'),
  accept('eval.env_server_base_port', 'env servers bind free loopback ports'),
  move('eval.concurrency', 'concurrency', { table: true }),
  refuseFeature('online', "watching weight broadcasts: evaluate a run's weights with weights_dir (and steps)"),
];

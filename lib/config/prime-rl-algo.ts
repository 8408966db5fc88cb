/**
 * prime-rl's `[orchestrator.algo]` (and a source's own `algo`) onto our algorithm's parts
 * (docs/algorithms.md): its `type` picks what it becomes,
 *
 *   grpo, max_rl, rae   orchestrator.advantage (type; length_penalty; rae's decay)
 *   echo                grpo's advantage + orchestrator.echo.roles (role -> alpha)
 *   opd                 [distill] type opd, its teacher (name, base_url) -> distill.teacher
 *   sft                 [distill] type sft, the model it samples from (sampling.source) -> distill.teacher
 *   opsd                [distill] type opsd (demo_key, template)
 *
 * and the parts it does not use are switched off, so that a source's algo replaces the run's
 * whole (as prime-rl's does). hierarchical_grpo (proposer-solver environments) is refused.
 */
import type { Converted } from './aliases';
import { refusal } from './aliases';
import { ConfigError } from '../failures';

type Raw = Record<string, unknown>;
const isTable = (v: unknown): v is Raw => typeof v === 'object' && v !== null && !Array.isArray(v);
const shown = (v: unknown) => JSON.stringify(v);

/** Where the parts go: `orchestrator.advantage`, `distill`, `orchestrator.echo`, or one `[[env]]`'s. */
export interface AlgoTargets {
  advantage: string;
  distill: string;
  echo: string;
  /** A source's algo: every part is set (the run's would otherwise apply). */
  whole: boolean;
}

/** The types of prime-rl's AlgoConfig union, and the keys of each besides `type` and `sampling`. */
const ALGO_KEYS: Record<string, readonly string[]> = {
  grpo: ['length_penalty'],
  echo: ['length_penalty', 'roles', 'filter'],
  max_rl: [],
  rae: ['decay'],
  opd: ['teacher'],
  sft: [],
  opsd: ['demo_key', 'template', 'renderer'],
};

/** A frozen model reference (FrozenModelConfig: a client config plus the served `name`) -> distill.teacher. */
function frozenModel(ref: unknown, key: string, where: string): Raw {
  if (!isTable(ref))
    throw new ConfigError(`${key} (${where}): expected a table with the served model's name and base_url`);
  const teacher: Raw = {};
  for (const [k, v] of Object.entries(ref)) {
    switch (k) {
      case 'name':
        // The served name is the model's Hugging Face name: the tokenizer check loads it, and
        // requests carry it as their `model`.
        teacher.model = v;
        teacher.served_model = v;
        break;
      case 'base_url':
      case 'api_key_var':
        teacher[k] = v;
        break;
      case 'wait_for_ready_timeout':
      case 'skip_model_check':
      case 'extra_headers_from_state':
        break; // every wait has its own deadline; the model is checked at the start; routing headers
      default:
        throw refusal(
          `${key}.${k}`,
          where,
          'client settings of a frozen model: ours are its base_url and api_key_var (a bearer token)',
        );
    }
  }
  for (const k of ['name', 'base_url'])
    if (!(k in ref))
      throw new ConfigError(
        `${key} (${where}): a frozen model needs ${k} (prime-rl only reaches models served elsewhere)`,
      );
  return teacher;
}

/** The length penalty table, checked to be prime-rl's linear one (its keys are ours). */
function lengthPenalty(v: unknown, key: string, where: string): Raw {
  if (!isTable(v)) throw new ConfigError(`${key} (${where}): expected a table`);
  return v;
}

/** Our keys for prime-rl's algorithm table `algo` at `key`. */
export function algoConverted(algo: unknown, key: string, where: string, to: AlgoTargets): Converted[] {
  if (!isTable(algo)) throw new ConfigError(`${key} (${where}): expected a table ([${key}])`);
  const type = algo.type ?? 'grpo';
  if (type === 'hierarchical_grpo')
    throw refusal(
      `${key}.type`,
      where,
      'algorithm "hierarchical_grpo" compares the roles of proposer-solver environments, which run nowhere here: grpo or rae',
    );
  const own = typeof type === 'string' ? ALGO_KEYS[type] : undefined;
  if (own === undefined)
    throw refusal(
      `${key}.type`,
      where,
      `unknown algorithm ${shown(type)}: prime-rl's are ${Object.keys(ALGO_KEYS).join(', ')} (and hierarchical_grpo)`,
    );
  const out: Converted[] = [];
  const show = (sub: string, target: string | null, value: unknown, note?: string) =>
    out.push({ from: `${key}.${sub}`, to: target, value, note, display: true });
  const advantage: Raw = {};
  const distill: Raw = {};
  let echo: Raw | false = false;
  let distilling = false;
  // The model rollouts are sampled from: the policy, except for sft.
  const source = isTable(algo.sampling)
    ? algo.sampling.source
    : algo.sampling === undefined
      ? undefined
      : algo.sampling;
  if (algo.sampling !== undefined && !isTable(algo.sampling))
    throw new ConfigError(`${key}.sampling (${where}): expected a table with source`);
  if (isTable(algo.sampling))
    for (const k of Object.keys(algo.sampling))
      if (k !== 'source') throw refusal(`${key}.sampling.${k}`, where, 'an algorithm samples from its source only');
  if (type === 'sft') {
    if (source === undefined || source === 'policy')
      throw new ConfigError(
        `${key}.sampling.source (${where}): algorithm "sft" samples from a teacher: set it to the served model (name, base_url); cross-entropy on the policy's own tokens distills nothing`,
      );
  } else if (source !== undefined && source !== 'policy')
    throw refusal(
      `${key}.sampling.source`,
      where,
      `algorithm ${shown(type)} trains on the policy's own samples (their logprobs and trust region): only "policy"; a teacher's samples are algorithm "sft"`,
    );
  for (const k of Object.keys(algo)) {
    if (k === 'type' || k === 'sampling') continue;
    if (!own.includes(k))
      throw refusal(
        `${key}.${k}`,
        where,
        `not a setting of algorithm ${shown(type)} (its: ${own.join(', ') || 'none'})`,
      );
  }
  switch (type) {
    case 'grpo':
    case 'echo':
    case 'max_rl':
    case 'rae':
      advantage.type = type === 'echo' ? 'grpo' : type;
      show('type', `${to.advantage}.type`, type, type === 'echo' ? "echo's policy term: grpo's advantage" : undefined);
      if (algo.length_penalty !== undefined) {
        advantage.length_penalty = lengthPenalty(algo.length_penalty, `${key}.length_penalty`, where);
        show('length_penalty', `${to.advantage}.length_penalty`, algo.length_penalty);
      }
      if (algo.decay !== undefined) {
        advantage.decay = algo.decay;
        show('decay', `${to.advantage}.decay`, algo.decay);
      }
      if (type === 'echo') {
        if (algo.filter !== undefined)
          throw refusal(
            `${key}.filter`,
            where,
            "echo's token filter is a Python callable: echo trains every token of a chosen role's observations here",
          );
        // Setting any role replaces the table; unset = tool at 0.1 (prime-rl's vetted default).
        const roles: Raw = {};
        const table = algo.roles ?? { tool: {} };
        if (!isTable(table)) throw new ConfigError(`${key}.roles (${where}): expected a table of roles`);
        for (const [role, cfg] of Object.entries(table)) {
          if (!isTable(cfg)) throw new ConfigError(`${key}.roles.${role} (${where}): expected a table (alpha)`);
          for (const k of Object.keys(cfg))
            if (k !== 'alpha') throw refusal(`${key}.roles.${role}.${k}`, where, 'a role has its alpha only');
          roles[role] = cfg.alpha ?? 0.1;
          show(`roles.${role}`, `${to.echo}.roles.${role}`, cfg, "the role's cross-entropy weight (alpha)");
        }
        echo = { roles };
      }
      break;
    case 'opd':
      distilling = true;
      distill.type = 'opd';
      distill.teacher = frozenModel(algo.teacher, `${key}.teacher`, where);
      show(
        'type',
        `${to.distill}.type`,
        type,
        "on-policy distillation: the teacher scores the policy's tokens (docs/algorithms.md)",
      );
      show(
        'teacher',
        `${to.distill}.teacher`,
        algo.teacher,
        "name: the teacher's Hugging Face name (its tokenizer) and served name",
      );
      break;
    case 'sft':
      distilling = true;
      distill.type = 'sft';
      distill.teacher = frozenModel(source, `${key}.sampling.source`, where);
      show(
        'type',
        `${to.distill}.type`,
        type,
        'the teacher samples the rollouts, the policy trains on them by cross-entropy',
      );
      show(
        'sampling.source',
        `${to.distill}.teacher`,
        source,
        "name: the teacher's Hugging Face name (its tokenizer) and served name",
      );
      break;
    case 'opsd':
      distilling = true;
      distill.type = 'opsd';
      show(
        'type',
        `${to.distill}.type`,
        type,
        'self-distillation: the policy, shown the demonstration, scores its tokens',
      );
      for (const k of ['demo_key', 'template'] as const)
        if (algo[k] !== undefined) {
          distill[k] = algo[k];
          show(k, `${to.distill}.${k}`, algo[k]);
        }
      if (algo.renderer !== undefined) {
        const name = isTable(algo.renderer) ? algo.renderer.name : undefined;
        if (
          !isTable(algo.renderer) ||
          !['auto', 'default'].includes(name as string) ||
          Object.keys(algo.renderer).length > 1
        )
          throw refusal(
            `${key}.renderer`,
            where,
            "the demonstration's system message renders with the model's chat template (renderer name auto or default only)",
          );
        show(
          'renderer',
          null,
          algo.renderer,
          "the demonstration's system message renders with the model's chat template",
        );
      }
      break;
  }
  // The values, key by key (a run's [orchestrator.algo] sets what it uses beside the rest of its
  // tables); a source's algo replaces the run's whole: the parts it does not use are switched off.
  const set = (part: string, value: unknown) => out.push({ to: part, value, quiet: true });
  if (Object.keys(advantage).length === 0 && to.whole) advantage.type = 'grpo';
  for (const [k, v] of Object.entries(advantage)) set(`${to.advantage}.${k}`, v);
  if (distilling) for (const [k, v] of Object.entries(distill)) set(`${to.distill}.${k}`, v);
  else if (to.whole) set(to.distill, false);
  if (echo !== false) set(`${to.echo}.roles`, echo.roles);
  else if (to.whole) set(to.echo, false);
  return out;
}

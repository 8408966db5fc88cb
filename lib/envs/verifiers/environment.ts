/**
 * `[[env]] id = "verifiers:<module>"`: an unmodified verifiers (0.4.0, `verifiers.v1`) environment,
 * served by its own env server (server.ts) in a Python environment. This is its side in our env API:
 * the args, and the dataset, which is the taskset's own tasks (`load()`), listed once per process by
 * our launcher (scripts/verifiers/serve_env.py `tasks`): the env server loads no dataset, the
 * orchestrator ships each task. Rollouts and scoring happen in the env server, never through
 * `respond`/`score` here (lib/orchestrator/verifiers-rollout.ts). See README.md beside this file.
 */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { z } from 'zod';
import { OPTIONAL_PARTS, setupCommand, type PartUse } from '../../optional-parts';
import { isVerifiersEnv, VERIFIERS_PREFIX } from '../../config/names';
import { describeDeepPath, jsonSyntaxError, MAX_JSON_DEPTH, pathTooDeep } from '../../json';
import { projectRoot } from '../../paths';
import { listDataset } from '../dataset';
import type { EnvironmentDefinition } from '../define';
import type { Example, JsonObject, Message } from '../types';

/** The venv that a config naming a verifiers env installs on first use (lib/optional-parts.ts). */
export const VERIFIERS_VENV = path.join(projectRoot, OPTIONAL_PARTS.verifiers.venv);
const LAUNCHER = path.join(projectRoot, 'scripts', 'verifiers', 'serve_env.py');
/** The launcher's exit status for a taskset verifiers cannot import (serve_env.py NOT_INSTALLED). */
const TASKSET_NOT_INSTALLED = 3;

const table = z.record(z.string(), z.unknown());

export const verifiersArgs = z.strictObject({
  taskset: table
    .default({})
    .describe("the taskset's config (verifiers TasksetConfig fields); its id is the module of the env id"),
  env: table
    .default({})
    .describe('other verifiers EnvConfig fields (agent, timeout, ...); agent.runtime defaults to a local subprocess'),
  python: z
    .string()
    .min(1)
    .optional()
    .describe('Python with verifiers 0.4.0 installed; default: .venv-verifiers/bin/python (installed on first use)'),
  paths: z.array(z.string().min(1)).default([]).describe('folders put on PYTHONPATH (where the env module lives)'),
  eval_size: z
    .union([z.number().min(0), z.literal('all')])
    .default(0.1)
    .describe('tasks held out as the eval split: a fraction, a count, or all (an eval-only taskset)'),
  timeout_s: z.number().positive().default(600).describe('seconds one rollout may take before it is cancelled'),
  start_timeout_s: z.number().positive().default(180).describe('seconds the env server may take to answer health'),
  max_concurrent: z.number().int().positive().optional().describe("the env server's rollouts in flight"),
});
export type VerifiersArgs = z.output<typeof verifiersArgs>;

type EnvEntry = { id: string; args?: Record<string, unknown> };

/**
 * The uses of .venv-verifiers in the config value at `key` (a list of envs, one env, or unset): each
 * verifiers env that names no args.python. The CLI installs the venv before a run whose config has
 * one (lib/cli/main.ts).
 */
export function verifiersVenvUses(key: string, envs: readonly EnvEntry[] | EnvEntry | undefined): PartUse[] {
  const entries = Array.isArray(envs)
    ? envs.map((e: EnvEntry, i) => [`${key}[${i}].id`, e] as const)
    : envs
      ? [[`${key}.id`, envs as EnvEntry] as const]
      : [];
  return entries
    .filter(([, e]) => isVerifiersEnv(e.id) && e.args?.python === undefined)
    .map(([k]) => ({ part: 'verifiers' as const, key: k }));
}

/** How to start one env's Python: the interpreter, its environment and the launcher's --config. */
export interface VerifiersLaunch {
  python: string;
  launcher: string;
  env: NodeJS.ProcessEnv;
  /** The verifiers EnvConfig as a dict. */
  config: JsonObject;
}

/**
 * What makes one launch's Python differ from another's: the interpreter, PYTHONPATH and the
 * EnvConfig (the rest of its environment is this process's). Envs whose args differ only in what
 * our side reads (eval_size, timeouts) are one launch: a run's train and eval entries of a taskset
 * share its task listing and its env server.
 */
export function launchKey(launch: VerifiersLaunch): string {
  return JSON.stringify([launch.python, launch.launcher, launch.env.PYTHONPATH ?? '', launch.config]);
}

export function verifiersLaunch(id: string, args: VerifiersArgs): VerifiersLaunch {
  const module = id.slice(VERIFIERS_PREFIX.length);
  if (!/^[A-Za-z_][\w.-]*(\/[\w.-]+)?(@[\w.+-]+)?$/.test(module))
    throw new Error(`environment "${id}": "${module}" is not a Python module name (verifiers:<module>)`);
  const python = args.python ? path.resolve(args.python) : path.join(VERIFIERS_VENV, 'bin', 'python');
  if (!fs.existsSync(python)) {
    throw new Error(
      args.python
        ? `environment "${id}": args.python ${args.python} does not exist`
        : `environment "${id}": ${python} does not exist; install it with \`${setupCommand('verifiers')}\`, or set args.python to a Python with verifiers==0.4.0`,
    );
  }
  const pythonPath = [...args.paths.map((p) => path.resolve(p)), process.env.PYTHONPATH].filter(Boolean).join(':');
  return {
    python,
    launcher: LAUNCHER,
    // Offline: the renderer loads the tokenizer from the local model folder, never from the Hub.
    env: {
      ...process.env,
      PYTHONPATH: pythonPath,
      HF_HUB_OFFLINE: '1',
      TRANSFORMERS_OFFLINE: '1',
      PYTHONUNBUFFERED: '1',
    },
    config: { ...args.env, taskset: { ...args.taskset, id: module } },
  };
}

/** A task's opening messages as our examples carry them (for display and prompt-length checks). */
function promptOf(task: JsonObject): Message[] {
  const system = typeof task.system_prompt === 'string' ? [{ role: 'system', content: task.system_prompt }] : [];
  const prompt = task.prompt;
  if (typeof prompt === 'string') return [...system, { role: 'user', content: prompt }] as Message[];
  if (Array.isArray(prompt)) return [...system, ...(prompt as Message[])] as Message[];
  return system as Message[];
}

/**
 * Task `n` of the launcher's output: a JSON object nested no deeper than MAX_JSON_DEPTH (it is sent
 * to the env server by a recursive encoder), else an error naming the env and the task.
 */
function taskOf(id: string, line: string, n: number): JsonObject {
  let task: unknown;
  try {
    task = JSON.parse(line);
  } catch (e) {
    throw new Error(
      `environment "${id}": task ${n} of the taskset's listing is not JSON (${jsonSyntaxError(e, line)})`,
    );
  }
  if (task === null || typeof task !== 'object' || Array.isArray(task))
    throw new Error(`environment "${id}": task ${n} of the taskset's listing is not a JSON object`);
  const deep = pathTooDeep(task);
  if (deep)
    throw new Error(
      `environment "${id}": task ${n} nests deeper than ${MAX_JSON_DEPTH} levels at ${describeDeepPath(deep)}`,
    );
  return task as JsonObject;
}

/**
 * Task listings of this process by launch (`launchKey`). A listing starts Python and imports
 * verifiers (5-7 CPU s on a 2-core EPYC), and a run loads each env in its cpu worker (the preflight)
 * and in each env pool worker, its eval entries beside its train entries: listed once per process,
 * as the env pool keeps a loaded env for its life.
 */
const listings = new Map<string, JsonObject[]>();

/** The taskset's tasks (their `task_data` dicts), listed by the launcher once per process. */
function listTasks(id: string, launch: VerifiersLaunch): JsonObject[] {
  const key = launchKey(launch);
  const listed = listings.get(key);
  if (listed) return listed;
  let out: string;
  try {
    out = execFileSync(launch.python, [launch.launcher, 'tasks', '--config', JSON.stringify(launch.config)], {
      env: launch.env,
      encoding: 'utf8',
      maxBuffer: 1 << 30,
      timeout: 600_000,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
  } catch (e) {
    const err = e as { stderr?: string; status?: number | null; message: string };
    const tail = (err.stderr ?? '').trim().split('\n').slice(-8).join('\n');
    if (err.status === TASKSET_NOT_INSTALLED) throw new Error(`environment "${id}": ${tail}`);
    throw new Error(`environment "${id}": listing the taskset's tasks failed: ${tail || err.message}`);
  }
  const tasks = out
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l, i) => taskOf(id, l, i + 1));
  if (tasks.length === 0) throw new Error(`environment "${id}": the taskset has no tasks`);
  listings.set(key, tasks);
  return tasks;
}

/** The definition behind `verifiers:<module>` (lib/envs/loader.ts). */
export function verifiersEnvironment(id: string): EnvironmentDefinition<typeof verifiersArgs> {
  return {
    name: id,
    description: 'a verifiers environment, run by its env server',
    args: verifiersArgs,
    create(args) {
      const tasks = listTasks(id, verifiersLaunch(id, args));
      const examples: Example[] = tasks.map((task) => ({
        prompt: promptOf(task),
        answer: typeof task.answer === 'string' ? task.answer : '',
        info: { task_data: task },
      }));
      const notHere = (what: string) => () => {
        throw new Error(`environment "${id}": ${what} runs in its verifiers env server, not in the env pool`);
      };
      return {
        dataset: listDataset(examples, { evalSize: args.eval_size === 'all' ? examples.length : args.eval_size }),
        rubric: [{ name: 'reward', fn: notHere('scoring') }],
        respond: notHere('the rollout'),
      };
    },
  };
}

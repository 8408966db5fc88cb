/**
 * `prime-rl <command> [subcommand] [@ file.toml ...] [--key value ...] [--dry-run] [--help]`
 *
 * Each command is a zod schema (lib/config/schemas/) plus a function that runs with the resolved
 * config. Help text and validation both come from the schema. The process entry (workers/cli.ts)
 * adds `worker`, whose code (activities, workflows) lib/ does not import.
 */
import * as fs from 'node:fs';
import { CommandError, ConfigError, describeFailure } from '../failures';
import { didYouMean } from '../config/did-you-mean';
import { aliasesHelp, describeMapped, MODEL_STRING, RL_ALIASES } from '../config/aliases';
import { PRIME_RL_EVAL_KEYS, PRIME_RL_RL_KEYS, PRIME_RL_SFT_KEYS } from '../config/prime-rl';
import { optionsHelp, SOURCES_HELP } from '../config/help';
import { hubCacheDir, resolveHubRefs } from '../hub';
import { loadConfig } from '../config/loader';
import * as schemas from '../config/schemas';
import { verifiersVenvUses } from '../envs/verifiers/environment';
import { ensureParts, PartNotInstalled } from '../optional-parts';
import { keepLoggingOnFullDisk, watchParentPipe } from '../proc';
import { command, type Command } from './command';
import { runsCommands } from './runs';
import { temporalCommands } from './temporal';

export type CommandTable = Record<string, Command | { summary: string; subcommands: Record<string, Command> }>;

/** Every command, `worker` given by the process entry. */
export const cliCommands = (worker: Command): CommandTable => ({
  rl: command({
    summary: 'run asynchronous RL: trainer, orchestrator and inference on Temporal',
    schema: schemas.rlSchema,
    shared: { keys: schemas.RL_SHARED_KEYS, sections: schemas.RL_SECTIONS, atLeast: schemas.RL_SHARED_AT_LEAST },
    aliases: [RL_ALIASES, PRIME_RL_RL_KEYS],
    hubNames: (c) => [
      { key: 'model.name', name: c.trainer.model.name, type: 'model' },
      ...(c.distill.teacher
        ? [{ key: 'distill.teacher.model', name: c.distill.teacher.model, type: 'model' as const }]
        : []),
      ...c.env.flatMap((e, i) =>
        e.distill && e.distill.teacher
          ? [{ key: `env[${i}].distill.teacher.model`, name: e.distill.teacher.model, type: 'model' as const }]
          : [],
      ),
    ],
    parts: (c) => [...verifiersVenvUses('env', c.env), ...verifiersVenvUses('eval.env', c.eval.env)],
    run: async (config) => (await import('../launch/rl')).runRl(config),
    dryRun: async (config) => {
      if (!config.slurm) return undefined;
      const { script } = (await import('../launch/slurm')).writeSlurmJob(config);
      return `sbatch script written, not submitted: ${script}`;
    },
  }),
  sft: command({
    summary: 'supervised fine-tuning as a Temporal workflow (cpu and trainer workers)',
    schema: schemas.sftSchema,
    aliases: [PRIME_RL_SFT_KEYS],
    hubNames: (c) => [
      { key: 'model.name', name: c.model.name, type: 'model' },
      ...(c.data.name ? [{ key: 'data.name', name: c.data.name, type: 'dataset' as const }] : []),
      ...c.data.source.flatMap((src, i) =>
        src.name ? [{ key: `data.source[${i}].name`, name: src.name, type: 'dataset' as const }] : [],
      ),
      ...(c.val.name ? [{ key: 'val.name', name: c.val.name, type: 'dataset' as const }] : []),
    ],
    parts: (c) => [
      ...verifiersVenvUses('data.env', c.data.env),
      ...c.data.source.flatMap((src, i) => verifiersVenvUses(`data.source[${i}].env`, src.env)),
      ...verifiersVenvUses('eval.env', c.eval.env),
    ],
    run: async (config) => (await import('../launch/sft')).runSft(config),
  }),
  eval: command({
    summary: 'evaluate model versions or an external API on environments',
    schema: schemas.evalSchema,
    aliases: [[MODEL_STRING], PRIME_RL_EVAL_KEYS],
    // An external API's model name is its own; a local server loads the model.
    hubNames: (c) =>
      c.client.base_url === undefined && c.model.name ? [{ key: 'model.name', name: c.model.name, type: 'model' }] : [],
    parts: (c) => verifiersVenvUses('env', c.env),
    run: async (config) => (await import('../launch/eval')).runEval(config),
  }),
  report: command({
    summary: "write a run's report.html (metrics, timeline, configs, evals)",
    schema: schemas.reportSchema,
    positional: 'run',
    run: async (config) => {
      const { writeReport } = await import('../report');
      process.stdout.write(`${writeReport(schemas.reportRunDir(config))}\n`);
    },
  }),
  inference: command({
    summary: 'serve a model: OpenAI-compatible API, /v1/generate, live weight updates',
    schema: schemas.inferenceSchema,
    hubNames: (c) => [{ key: 'model.name', name: c.model.name, type: 'model' }],
    run: async (config) => (await import('./inference')).runInference(config),
  }),
  worker,
  model: {
    summary: 'model tools',
    subcommands: {
      create: command({
        summary: 'write a random-initialised Hugging Face model folder',
        schema: schemas.modelCreateSchema,
        run: async (config) => {
          const { createModelFromConfig } = await import('../model/create');
          const { ModelTooLarge } = await import('../model/bounds');
          try {
            await createModelFromConfig(config);
          } catch (e) {
            // The sizes are the options' camelCase names (numLayers: --num-layers).
            if (e instanceof ModelTooLarge)
              throw new ConfigError(`${e.key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)}: ${e.message}`);
            throw e;
          }
        },
      }),
      plan: command({
        summary:
          'the memory one training rank needs (weights, gradients, AdamW, activations) and the longest row that fits',
        schema: schemas.modelPlanSchema,
        run: async (config) => {
          const { printModelPlan } = await import('../trainer/plan');
          process.stdout.write(`${printModelPlan(config)}\n`);
        },
      }),
    },
  },
  temporal: { summary: 'the local Temporal dev server', subcommands: temporalCommands },
  runs: { summary: 'list, inspect and steer runs', subcommands: runsCommands },
});

function usage(commands: CommandTable): string {
  const lines = Object.entries(commands).flatMap(([name, c]) =>
    'subcommands' in c
      ? Object.entries(c.subcommands).map(([sub, s]) => `  ${`${name} ${sub}`.padEnd(18)} ${s.summary}`)
      : [`  ${name.padEnd(18)} ${c.summary}`],
  );
  return `Usage: prime-rl <command> [@ config.toml ...] [--key value ...] [--dry-run] [--help]\n\nCommands:\n${lines.join('\n')}\n\nRun 'prime-rl <command> --help' for its options.`;
}

function commandHelp(name: string, c: Command): string {
  const aliases = c.aliases
    ? `\n\nThe Python prime-rl's keys (its documented config, and its config classes today) are accepted too, in top-level files and\nas flags, mapped onto ours or refused with the reason (two spellings of one key in one file or command line: an error;\n--dry-run lists the mapping on stderr):\n${c.aliases.map((t) => aliasesHelp(t)).join('\n\n')}`
    : '';
  return `Usage: prime-rl ${name} [@ config.toml ...] [--key value ...]\n\n${c.summary}\n\n${SOURCES_HELP}\n\nOptions (type, default, description):${optionsHelp(c.schema)}${aliases}`;
}

/**
 * prime-rl's commands that are parts of one command here: its per-process files (the k8s
 * example's orch.toml and train.toml) are read by `rl` scoped to their section.
 */
const PYTHON_ONLY_COMMANDS: Record<string, string> = {
  orchestrator:
    "the orchestrator runs inside a run's workflow here: give its file to `prime-rl rl --orchestrator @ orch.toml` (with --trainer @ train.toml and --inference @ infer.toml), or run `prime-rl worker --pool cpu` on a cluster (docs/cluster.md)",
  trainer:
    "the trainer runs inside a run's workflow here: give its file to `prime-rl rl --trainer @ train.toml` (with --orchestrator @ orch.toml and --inference @ infer.toml), or run `prime-rl worker --pool trainer` on a cluster (docs/cluster.md)",
  'env-server': 'env servers are started by the cpu workers themselves, one per verifiers environment',
};

/** Finds the command named by the leading arguments; returns it with the remaining arguments. */
function resolveCommand(commands: CommandTable, argv: string[]): { name: string; cmd: Command; rest: string[] } {
  // prime-rl's `evals` (a model and [eval] sources) is our `eval`, which reads its files.
  const [first, second] = argv[0] === 'evals' ? ['eval', argv[1]] : argv;
  const entry = commands[first];
  if (!entry && PYTHON_ONLY_COMMANDS[first])
    throw new ConfigError(`'prime-rl ${first}' is prime-rl's command; ${PYTHON_ONLY_COMMANDS[first]}`);
  if (!entry)
    throw new ConfigError(
      `unknown command '${first}'.${didYouMean(first, Object.keys(commands))} Run 'prime-rl --help'.`,
    );
  if (!('subcommands' in entry)) return { name: first, cmd: entry, rest: argv.slice(1) };
  const subs = Object.keys(entry.subcommands);
  if (second === undefined || second.startsWith('-')) {
    if (second === '--help' || second === '-h' || second === undefined) {
      throw new HelpRequest(
        `Usage: prime-rl ${first} <${subs.join('|')}> ...\n\n${subs.map((s) => `  ${s.padEnd(10)} ${entry.subcommands[s].summary}`).join('\n')}`,
      );
    }
    throw new ConfigError(`'prime-rl ${first}' needs a subcommand: ${subs.join(', ')}`);
  }
  const cmd = entry.subcommands[second];
  if (!cmd)
    throw new ConfigError(
      `unknown subcommand '${first} ${second}'.${didYouMean(second, subs)} Choose one of: ${subs.join(', ')}`,
    );
  return { name: `${first} ${second}`, cmd, rest: argv.slice(2) };
}

class HelpRequest extends Error {}

export async function runCli(commands: CommandTable, argv: string[]): Promise<number> {
  try {
    if (argv.length === 0 || argv[0] === '--help' || argv[0] === '-h' || argv[0] === 'help') {
      process.stdout.write(`${usage(commands)}\n`);
      return 0;
    }
    const { name, cmd, rest } = resolveCommand(commands, argv);
    if (rest.includes('--help') || rest.includes('-h')) {
      process.stdout.write(`${commandHelp(name, cmd)}\n`);
      return 0;
    }
    const args =
      cmd.positional && rest[0] !== undefined && !rest[0].startsWith('-') && !rest[0].startsWith('@')
        ? [`--${cmd.positional}`, ...rest]
        : rest;
    const otherSchemas = Object.values(commands)
      .flatMap((c) => ('subcommands' in c ? Object.values(c.subcommands) : [c]))
      .map((c) => c.schema)
      .filter((s) => s !== cmd.schema);
    const loaded = loadConfig({
      schema: cmd.schema,
      argv: args,
      shared: cmd.shared,
      aliases: cmd.aliases?.flat(),
      otherSchemas,
    });
    const hub = resolveHubRefs(cmd.hubNames?.(loaded.config) ?? []);
    if (loaded.dryRun) {
      // stderr: stdout stays the resolved config alone (input for `temporal workflow start`).
      if (loaded.mapped.length > 0)
        process.stderr.write(`prime-rl keys mapped onto ours:\n${describeMapped(loaded.mapped)}\n`);
      if (hub.length > 0)
        process.stderr.write(
          `Hugging Face names, from the local cache (${hubCacheDir()}):\n${hub
            .map(
              (h) =>
                `  ${h.ref.key} = ${JSON.stringify(h.ref.name)} -> ${h.dir ?? `not found (the run would exit 2): ${h.error}`}`,
            )
            .join('\n')}\n`,
        );
      const extra = await cmd.dryRun?.(loaded.config);
      if (extra) process.stderr.write(`${extra}\n`);
      const json = JSON.stringify(loaded.config, null, 2);
      if (loaded.dryRunFile) fs.writeFileSync(loaded.dryRunFile, `${json}\n`);
      process.stdout.write(`${json}\n`);
      return 0;
    }
    // A name found nowhere is bad input: said before anything starts.
    const missing = hub.find((h) => h.error);
    if (missing) throw new ConfigError(missing.error!);
    await ensureParts(cmd.parts?.(loaded.config) ?? [], { say: (line) => process.stderr.write(`${line}\n`) });
    await cmd.run(loaded.config);
    return 0;
  } catch (e) {
    if (e instanceof HelpRequest) {
      process.stdout.write(`${e.message}\n`);
      return 0;
    }
    if (e instanceof ConfigError || e instanceof CommandError || e instanceof PartNotInstalled) {
      process.stderr.write(`error: ${e.message}\n`);
      return e.exitCode;
    }
    if ((e as { signal?: string }).signal) {
      // Interrupted (Ctrl-C / SIGTERM): the command already cleaned up and says how to resume.
      process.stderr.write(`${(e as Error).message}\n`);
      return 130;
    }
    if ((e as Error).name === 'WorkflowFailedError') {
      // The stack of the client call says nothing; the failure chain says what went wrong where.
      const { message, badInput } = describeFailure(e as Error);
      process.stderr.write(`error: ${message}\n`);
      return badInput ? 2 : 1;
    }
    process.stderr.write(`error: ${(e as Error).stack ?? String(e)}\n`);
    return 1;
  }
}

/**
 * Runs the CLI as the process (workers/cli.ts). Exits when the command is done: a client still retrying a
 * Temporal server the command just stopped must not keep the process alive. Started by the
 * launcher, it also stops when the launcher dies.
 */
export function main(commands: CommandTable, argv: string[]): void {
  keepLoggingOnFullDisk();
  watchParentPipe();
  runCli(commands, argv).then(
    (code) => process.exit(code),
    (e) => {
      process.stderr.write(`${String(e)}\n`);
      process.exit(1);
    },
  );
}
